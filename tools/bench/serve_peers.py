"""The servers ``graphrt bench serve`` measures: ``graphrt serve``, and ``transformers serve`` on the
same weights — or, where that cannot run, transformers' ``generate`` in this process.

transformers cannot serve a GGUF it loaded (its config names no architecture) nor save one, so
its peer reads a transformers checkpoint of the very tensors graphrt runs: the GGUF dequantised
by graphrt's loader, renamed back (``model_twin.checkpoint_twin``), saved once under the user's
cache (``$XDG_CACHE_HOME/graphrt/hf`` or ``~/.cache/graphrt/hf``), keyed by the file's size and
modification time. A checkpoint directory is served as it is.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from graphrt.tools.bench.serve_load import Load, Sample

#: Seconds a server may take to answer ``GET /v1/models`` after it was started.
START_TIMEOUT_S = 180.0


class PeerUnavailable(RuntimeError):
    """The peer server cannot run here (the reason says why)."""


@dataclass(slots=True)
class Server:
    """A server in a subprocess: ``url`` and the model id its requests name."""

    name: str
    url: str
    model: str
    proc: subprocess.Popen[bytes]
    log: Path
    started_s: float

    def stop(self) -> None:
        """Ctrl-C, then kill after 30 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _start(name: str, cmd: list[str], port: int, model: str, log: Path) -> Server:
    """Run ``cmd`` and wait until ``GET /health`` answers (or the process dies).

    NOTE: not ``/v1/models``: transformers serve lists models by scanning the Hugging Face cache
    and answers 500 where that directory does not exist (seen on the GPU machine), so the hub
    cache is also pointed at a directory that exists.
    """
    url, start = f"http://127.0.0.1:{port}", time.perf_counter()
    hub = log.parent / "hf-hub"
    hub.mkdir(exist_ok=True)
    env = os.environ | {
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_CACHE": str(hub),
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    while time.perf_counter() - start < START_TIMEOUT_S:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-1500:]
            raise PeerUnavailable(f"{name} exited with code {proc.returncode}: {tail}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                return Server(name, url, model, proc, log, time.perf_counter() - start)
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise PeerUnavailable(f"{name} did not answer within {START_TIMEOUT_S:.0f} s (log: {log})")


def start_graphrt(model: str, device: str, port: int, max_batch_size: int, log: Path) -> Server:
    cmd = [
        sys.executable,
        "-m",
        "graphrt",
        "serve",
        "--model",
        model,
        "--device",
        device,
        "--port",
        str(port),
    ]
    # NOTE: every graph before the first request: the timed load measures serving, not capture
    cmd += ["--capture", "eager", "--max-batch-size", str(max_batch_size)]
    return _start("graphrt serve", cmd, port, model, log)


def start_transformers(checkpoint: Path, device: str, port: int, batching: bool, log: Path) -> Server:
    """``transformers serve`` of ``checkpoint`` (with continuous batching when ``batching``)."""
    from transformers.utils.import_utils import is_serve_available

    if not is_serve_available():
        raise PeerUnavailable("transformers serve needs pydantic, fastapi, uvicorn and openai")
    # NOTE: the console script's own code, run by this interpreter (no PATH lookup)
    cmd = [
        sys.executable,
        "-c",
        "from transformers.cli.transformers import main; main()",
        "serve",
        str(checkpoint),
    ]
    cmd += ["--port", str(port), "--device", device, *(["--continuous-batching"] if batching else [])]
    return _start("transformers serve", cmd, port, str(checkpoint), log)


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "graphrt" / "hf"


def hf_checkpoint(model: str) -> Path:
    """A transformers checkpoint directory holding the weights graphrt runs for ``model``."""
    from graphrt.checkpoints.loader import resolve

    path = resolve(model)
    if path is None:
        raise PeerUnavailable(f"{model} is a preset with random weights: it has no checkpoint to serve")
    if path.is_dir():
        return path
    stat = path.stat()
    target = cache_dir() / f"{path.stem}-{stat.st_size}-{stat.st_mtime_ns}"
    if not (target / "config.json").is_file():
        _save_twin(model, target)
    return target


def _save_twin(model: str, target: Path) -> None:
    from transformers.utils import logging as hf_logging

    from graphrt.checkpoints import load
    from graphrt.text import load_tokenizer
    from graphrt.tools.bench.model_twin import checkpoint_twin

    twin = checkpoint_twin(load(model, device="cpu", dtype=torch.float32))
    tokenizer = load_tokenizer(model)
    twin.generation_config.eos_token_id = sorted(tokenizer.stop_ids)
    partial = target.with_name(target.name + ".partial")
    hf_logging.disable_progress_bar()  # NOTE: its shard bar would cut through ours
    try:
        twin.save_pretrained(partial)
    finally:
        hf_logging.enable_progress_bar()
    tokenizer.backend.save(str(partial / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": tokenizer.chat_template}
    (partial / "tokenizer_config.json").write_text(json.dumps(config | tokenizer.special, indent=2))
    partial.rename(target)  # NOTE: a crash mid-save leaves no directory that looks complete


def generate_peer(
    checkpoint: Path, device: torch.device, prompts: Sequence[str], concurrency: int, max_tokens: int
) -> Load:
    """transformers' ``generate`` in this process, ``concurrency`` prompts per batch (left-padded).

    TTFT is the time of a one-token ``generate`` of the batch (its prefill), measured apart.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=dtype).to(device).eval()
    tok = AutoTokenizer.from_pretrained(checkpoint, padding_side="left")
    tok.pad_token = tok.pad_token or tok.eos_token
    stops = set(model.generation_config.eos_token_id or ())
    samples, start = [], time.perf_counter()
    for i in range(0, len(prompts), concurrency):
        chats = [[{"role": "user", "content": p}] for p in prompts[i : i + concurrency]]
        texts = [tok.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chats]
        batch = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        ttft = _timed(lambda b=batch: model.generate(**b, max_new_tokens=1, do_sample=False), device)[1]
        out, total = _timed(
            lambda b=batch: model.generate(**b, max_new_tokens=max_tokens, do_sample=False), device
        )
        for row in out[:, batch["input_ids"].shape[1] :].tolist():
            n = next((k + 1 for k, t in enumerate(row) if t in stops), len(row))
            samples.append(Sample(ttft, total, n, tok.decode(row[:n], skip_special_tokens=True)))
    return Load(samples, time.perf_counter() - start)


def _timed(fn: object, device: torch.device) -> tuple[torch.Tensor, float]:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    with torch.no_grad():
        out = fn()  # type: ignore[operator]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out, time.perf_counter() - start

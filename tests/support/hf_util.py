"""Tiny random transformers checkpoints and a prefill + decode parity run against them.

Nothing is downloaded: transformers builds each model from a config with random weights
(norms and biases perturbed too, so a mis-mapped tensor changes the logits) and saves it.
"""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.torch as safetensors_torch
import torch

from graphrt import Batch, ForwardMode, RuntimeConfig
from graphrt.checkpoints import load
from graphrt.engine.stack import stack_for
from graphrt.models.causal_lm import CausalLM
from graphrt.models.mla import MLACausalLM

PAGE_SIZE, MAX_CONTEXT, BUCKETS = 16, 64, (1, 2, 4)
PROMPT_LENS, DECODE_STEPS = (5, 17, 9), 4


#: Tiny transformers configs shared by the checkpoint and wrapper tests.
SMALL = dict(
    vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, max_position_embeddings=128
)
LLAMA3 = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Weights ``N(0, 1/fan_in)``, norms ``1 + N(0, 0.1)``, biases ``N(0, 0.1)``."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if "norm" in name:
                p.copy_(1 + 0.1 * noise)
            elif name.endswith("bias"):
                p.copy_(0.1 * noise)
            else:
                p.copy_(noise * (1 if "embed" in name else p.shape[-1] ** -0.5))


def save_checkpoint(
    path: Path, model_cls: Any, config: Any, *, seed: int = 0, legacy_rope: bool = False
) -> torch.nn.Module:
    """Save a random ``model_cls(config)``; ``legacy_rope`` rewrites rope keys as ``rope_theta`` + ``rope_scaling``."""
    model = model_cls(config).eval()
    randomize(model, seed)
    model.save_pretrained(path)
    if legacy_rope:
        raw = json.loads((path / "config.json").read_text())
        params = raw.pop("rope_parameters")
        raw["rope_theta"] = params.pop("rope_theta")
        raw["rope_scaling"] = params if params.get("rope_type", "default") != "default" else None
        (path / "config.json").write_text(json.dumps(raw))
    return model


def saved_reference(
    path: Path, model_cls: str, config_cls: str, kwargs: dict[str, Any], legacy: bool = False
) -> Any:
    """Save a random transformers ``model_cls(config_cls(**SMALL, **kwargs))`` at ``path`` and
    return it reloaded from there in fp32 (the reference); ``legacy``: as :func:`save_checkpoint`."""
    import transformers

    config = getattr(transformers, config_cls)(**SMALL, **kwargs)
    save_checkpoint(path, getattr(transformers, model_cls), config, legacy_rope=legacy)
    # NOTE: the reference reloads the saved files, so legacy rope keys go through transformers too.
    return getattr(transformers, model_cls).from_pretrained(path, dtype=torch.float32).eval()


#: An fp32 model on the GPU: its Triton GEMMs take float32 dots as TF32 (10-bit mantissas).
CUDA_FP32_ATOL = 1e-2


def check_checkpoint(
    device: torch.device, path: Path, reference: Any, dtype: torch.dtype | None = None
) -> None:
    """``graphrt.checkpoints.load(path)``: prefill and decode logits (graphed and eager) == transformers'.

    ``dtype``: the model's (default: bf16 on the GPU, fp32 on the CPU)."""
    seqs = sequences(reference.config.vocab_size)
    model = load(path, device=device, dtype=dtype)
    fp32_cuda = device.type == "cuda" and dtype == torch.float32
    atol = CUDA_FP32_ATOL if fp32_cuda else tolerance(device, reference, seqs)
    rtol = atol if device.type != "cuda" else 0.0
    assert_parity(run_graphrt(model, seqs), reference_logits(reference, seqs), atol=atol, rtol=rtol)


@torch.no_grad()
def check_greedy_generate(path: Path, reference: Any, new: int = 8) -> None:
    """``Engine(path)`` (graphed DECODE, fp32 CPU) gives transformers' greedy ``generate`` tokens,
    and a batch gives each prompt the tokens it gets alone."""
    from graphrt import Engine

    seqs = sequences(reference.config.vocab_size, seed=1)
    prompts = [s[:n] for s, n in zip(seqs, PROMPT_LENS, strict=True)]
    engine = Engine(str(path), device="cpu", max_batch_size=4, max_context_len=64, buckets=BUCKETS)
    ours = engine.generate(prompts, new)
    assert engine.stats().replays["DECODE"] > 0
    assert [engine.generate([p], new)[0] for p in prompts] == ours
    for prompt, got in zip(prompts, ours, strict=True):
        # NOTE: transformers stops at EOS; graphrt's generate runs the count it was given.
        want = reference.generate(torch.tensor([prompt]), max_new_tokens=new, do_sample=False, pad_token_id=0)
        assert got[: want.shape[1] - len(prompt)] == want[0, len(prompt) :].tolist()


@torch.no_grad()
def tolerance(device: torch.device, reference: Any, seqs: list[list[int]]) -> float:
    """fp32 (CPU): 1e-4. bf16 (CUDA): three times transformers' own bf16 error.

    NOTE: a bf16 forward cannot match fp32 logits closer than rounding allows; the bound is what
    transformers' bf16 forward of the same weights misses its fp32 forward by, times three.
    """
    if device.type != "cuda":
        return 1e-4
    fp32 = reference_logits(reference, seqs)
    bf16 = reference_logits(copy.deepcopy(reference).to(torch.bfloat16), seqs)
    floor = max((a - b).abs().max().item() for a, b in zip(fp32, bf16, strict=True))
    return max(3 * floor, 1e-2)


def reference_logits(model: torch.nn.Module, sequences: list[list[int]]) -> list[torch.Tensor]:
    """transformers' logits ``[len, vocab]`` (fp32, CPU) of each full sequence, no cache."""
    return [model(torch.tensor([s]), use_cache=False).logits[0].float() for s in sequences]


@dataclass
class ParityRun:
    """graphrt logits for the same sequences: prefill rows, then one row per request per step."""

    prefill: list[torch.Tensor]
    decode_graph: list[torch.Tensor]
    decode_eager: list[torch.Tensor]


def sequences(vocab: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, n + DECODE_STEPS).tolist() for n in PROMPT_LENS]


def _slots(req: int, positions: range, pages_per_req: int) -> list[int]:
    return [(req * pages_per_req + p // PAGE_SIZE) * PAGE_SIZE + p % PAGE_SIZE for p in positions]


def run_graphrt(model: CausalLM | MLACausalLM, seqs: list[list[int]]) -> ParityRun:
    """Prefill every prompt (EXTEND), then ``DECODE_STEPS`` steps graphed and eager on the same KV."""
    config = RuntimeConfig(
        max_batch_size=max(BUCKETS),
        max_context_len=MAX_CONTEXT,
        page_size=PAGE_SIZE,
        buckets=BUCKETS,
        warmup=1,
    )
    stack = stack_for(model, config)
    stack.runtime.capture()
    reqs, pages = range(len(seqs)), config.max_pages
    prompt = Batch.create(
        ForwardMode.EXTEND,
        input_ids=np.concatenate([s[:n] for s, n in zip(seqs, PROMPT_LENS, strict=True)]),
        seq_lens=list(PROMPT_LENS),
        req_pool_indices=list(reqs),
        out_cache_loc=[x for r, n in zip(reqs, PROMPT_LENS, strict=True) for x in _slots(r, range(n), pages)],
        q_lens=list(PROMPT_LENS),
    )
    rows = stack.runtime.run(prompt).float().cpu()
    run = ParityRun(list(rows.split(list(PROMPT_LENS))), [], [])
    for step in range(DECODE_STEPS):
        lens = [n + step + 1 for n in PROMPT_LENS]
        batch = Batch.create(
            ForwardMode.DECODE,
            input_ids=[s[n - 1] for s, n in zip(seqs, lens, strict=True)],
            seq_lens=lens,
            req_pool_indices=list(reqs),
            out_cache_loc=[_slots(r, range(n - 1, n), pages)[0] for r, n in zip(reqs, lens, strict=True)],
        )
        run.decode_eager.append(stack.runtime.run(batch, eager=True).float().cpu())
        run.decode_graph.append(stack.runtime.run(batch).float().cpu())
    assert stack.runtime.stats().replays, "no decode step replayed a graph"
    return run


def assert_parity(run: ParityRun, expected: list[torch.Tensor], atol: float, rtol: float) -> None:
    """graphrt's prefill and decode logits (graphed and eager) equal transformers' per position."""
    for r, n in enumerate(PROMPT_LENS):
        torch.testing.assert_close(run.prefill[r], expected[r][:n], atol=atol, rtol=rtol)
    for step in range(DECODE_STEPS):
        want = torch.stack([expected[r][n + step] for r, n in enumerate(PROMPT_LENS)])
        torch.testing.assert_close(run.decode_eager[step], want, atol=atol, rtol=rtol)
        torch.testing.assert_close(run.decode_graph[step], want, atol=atol, rtol=rtol)


def save_word_tokenizer(path: Path, vocab: int) -> None:
    """A word-level tokenizer (``t0 … t{vocab-1}``, EOS the last) saved beside a tiny checkpoint.

    Nothing is downloaded: ``graphrt generate`` needs a tokenizer for text and stop ids.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {f"t{i}": i for i in range(vocab)}
    tok = Tokenizer(models.WordLevel(words, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=f"t{vocab - 1}").save_pretrained(path)


def edited_copy(
    path: Path, out: Path, config: Callable[[dict], None] | None, tensors: Callable[[dict], None] | None
) -> Path:
    """A copy of the checkpoint directory ``path`` at ``out``, its ``config.json`` and its
    ``model.safetensors`` tensors passed through ``config`` / ``tensors`` (in place) when given."""
    shutil.copytree(path, out)
    if config is not None:
        raw = json.loads((out / "config.json").read_text())
        config(raw)
        (out / "config.json").write_text(json.dumps(raw))
    if tensors is not None:
        state = safetensors_torch.load_file(out / "model.safetensors")
        tensors(state)
        safetensors_torch.save_file(state, out / "model.safetensors")
    return out

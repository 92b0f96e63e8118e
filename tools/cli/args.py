"""Argument types and checks for the ``graphrt`` commands.

Every bad value ends the command with one line on stderr that names the flag, the value and
what is allowed, and exit code 2 (argparse's convention), never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Callable
from typing import NoReturn

import torch

from graphrt.parallel import TPGroup, init_tp, shutdown

#: ``--backend`` and ``--device`` values meaning "the best this machine has".
AUTO = "auto"
LOG_LEVELS = ("debug", "info", "warning", "error")


class UsageError(Exception):
    """A command-line value that cannot be used: ``flag``, ``value`` and what is allowed."""

    def __init__(self, flag: str, value: object, allowed: str) -> None:
        super().__init__(f"argument {flag}: {value!r} {allowed}")
        self.flag, self.value, self.allowed = flag, value, allowed


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line (no usage block) and shown defaults."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("formatter_class", argparse.ArgumentDefaultsHelpFormatter)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def error(self, message: str) -> NoReturn:
        """Print ``message`` as one line and exit with code 2."""
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# ---- argument types (argparse prefixes "argument --flag: ") ------------------------------
def positive_int(text: str) -> int:
    """An integer ≥ 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def port_number(text: str) -> int:
    """A TCP port: an integer in [1, 65535]."""
    value = int(text) if text.strip().isdigit() else 0
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port: allowed 1 to 65535")
    return value


def seconds(text: str) -> float:
    """A finite number of seconds >= 0 (``nan``, ``inf`` and negatives refused)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value < float("inf"):  # NOTE: also refuses nan
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds: allowed finite, >= 0")
    return value


def megabytes(text: str) -> float:
    """A finite number of MiB > 0."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0.0 < value < float("inf") or value * 2**20 < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size in MiB: allowed finite, > 0")
    return value


def batch_sizes(text: str) -> tuple[int, ...]:
    """``"1,8,64"`` → ``(1, 8, 64)``: comma-separated positive integers."""
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of positive integers (e.g. 1,8,64)"
        )
    return tuple(int(p) for p in parts)


def device_name(text: str) -> str:
    """``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (availability is checked by :func:`resolve_device`)."""
    if text != AUTO and not re.fullmatch(r"cpu|cuda(:\d+)?", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a device: use auto, cpu, cuda or cuda:N")
    return text


# ---- checks that need the machine ----------------------------------------------------------
def resolve_device(value: str) -> torch.device:
    """The device ``--device value`` names, after checking that this torch can use it."""
    if value == AUTO:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(value)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            build = "a CPU build" if torch.version.cuda is None else "a CUDA build, but no GPU is visible"
            raise UsageError("--device", value, f"is not available: torch {torch.__version__} is {build}")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise UsageError("--device", value, f"is not available: {count} GPU(s), cuda:0..cuda:{count - 1}")
    return device


def resolve_backend(value: str, device: torch.device, model: str = "tiny-llama") -> str | None:
    """``None`` for ``auto``; else ``value`` after checking it can run ``model`` on ``device``."""
    from graphrt.attention import available_backends
    from graphrt.checkpoints.loader import default_dtype
    from graphrt.models.presets import PRESETS, DSAConfig, MLAConfig, preset

    if value == AUTO:
        return None
    cfg = preset(model) if model in PRESETS else None
    kind, need = "mha", {}
    if isinstance(cfg, DSAConfig) or getattr(cfg, "indexer", None) is not None:
        kind, need = "sparse_mla", {"layout": "bf16", "num_heads": cfg.num_heads}
    elif isinstance(cfg, MLAConfig):
        dims = {"rope_dim": cfg.qk_rope_head_dim, "kv_lora_rank": cfg.kv_lora_rank}
        kind, need = "mla", {"dtype": default_dtype(device), **dims}
    usable = available_backends(device, kind, **need)
    if value not in usable:
        why = " (sgl_kernel does not import here; pip install -e '.[gpu]')" if value == "fa3" else ""
        raise UsageError(
            "--backend", value, f"is not available on {device}{why}; available: {', '.join(usable)}"
        )
    return value


def backend_names() -> list[str]:
    """Every registered attention backend, for ``--backend`` choices."""
    from graphrt.attention import BACKENDS

    return [AUTO, *dict.fromkeys(name for names in BACKENDS.values() for name in names)]


def kv_cache_dtypes() -> list[str]:
    """``--kv-cache-dtype`` values: MHA/GQA cache dtypes, then DSA presets' MLA layouts."""
    from graphrt.kv.mla import LAYOUTS
    from graphrt.kv.quant import MHA_KV_DTYPES

    return [*MHA_KV_DTYPES, *LAYOUTS]


def model_names() -> list[str]:
    """Every built-in preset and packaged model name."""
    from graphrt.checkpoints.loader import PACKAGED
    from graphrt.models.presets import PRESETS

    return [*PRESETS, *PACKAGED]


def model_name(text: str) -> str:
    """A preset, a packaged model (``smollm2``), a checkpoint directory or a ``.gguf`` file."""
    from pathlib import Path

    path = Path(text)
    if text == AUTO or text in model_names() or (path.is_dir() and (path / "config.json").is_file()):
        return text
    if path.suffix == ".gguf" and path.is_file():
        return text
    raise argparse.ArgumentTypeError(
        f"{text!r} is not a model: use one of {', '.join(model_names())}, a checkpoint directory "
        "(config.json + *.safetensors) or a .gguf file"
    )


def token_ids(text: str) -> list[int]:
    """``"1,2,3"`` → ``[1, 2, 3]``: comma-separated non-negative integers."""
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of token ids (e.g. 1,2,3)")
    return [int(p) for p in parts]


def configure_logging(level: str) -> None:
    """``graphrt…`` loggers to stderr through rich, at ``level``; other libraries stay quiet."""
    from rich.console import Console
    from rich.logging import RichHandler

    logger = logging.getLogger("graphrt")
    logger.handlers.clear()
    handler = RichHandler(console=Console(stderr=True), show_path=False, show_time=level == "debug")
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False


#: An optional package → the extra of pyproject.toml that installs it.
EXTRAS = {
    "textual": "tui",
    "fastapi": "serve",
    "uvicorn": "serve",
    "transformers": "models",
    "gguf": "models",
    "tokenizers": "models",
    "safetensors": "models",
    "accelerate": "models",
    "sgl_kernel": "gpu",
}


def install_hint(err: ImportError) -> str | None:
    """The one line naming the missing package and the command installing it, or None when
    ``err`` is not about a package of an extra."""
    names = [e.name for e in (err, err.__cause__) if isinstance(e, ImportError) and e.name]
    name = next((n.split(".")[0] for n in names if n.split(".")[0] in EXTRAS), None)
    if name is None:
        return None
    extra = EXTRAS[name]
    return (
        f"this needs {name}, which the {extra} extra installs: pip install 'graphrt[{extra}]' "
        f"(in a clone: pip install -e '.[{extra}]')"
    )


def fail(prog: str, err: Exception) -> int:
    """Print ``err`` as the one-line error of ``prog``; returns the exit code (2)."""
    print(f"{prog}: error: {err}", file=sys.stderr)
    return 2


def under_tp(
    args: argparse.Namespace,
    body: Callable[[argparse.Namespace, torch.device, str | None, TPGroup], int],
) -> int:
    """Run a bench's ``body(args, device, backend, tp)`` on this rank's device with ``args.tp``
    ranks (a process group when tp > 1, shut down after, whatever ``body`` raises)."""
    device = resolve_device(args.device)
    backend = resolve_backend(args.backend, device)
    size = getattr(args, "tp", 1)
    tp = init_tp(size, device)
    try:
        return body(args, tp.device if size > 1 else device, backend, tp)
    finally:
        if size > 1:
            shutdown()

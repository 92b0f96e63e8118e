"""A Hugging Face checkpoint directory: ``config.json`` + ``*.safetensors`` (sharded or not).

Shapes come from the file headers (nothing is read); tensors are read with ``safe_open``
straight onto the target device, one at a time, and only the rows or columns a tensor-parallel
rank keeps (``get_slice``: the rest of the tensor is never read).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from graphrt.models.checkpoint import CheckpointError, Shape
from graphrt.models.hf_config import ModelConfig, parse_config
from graphrt.models.parallel import Shard

#: safetensors dtypes a checkpoint may hold; anything else is a quantised format.
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")


def _safe_open(file: Path, device: str) -> Any:
    try:
        from safetensors import safe_open
    except ImportError as err:  # pragma: no cover - dev extra installs it
        raise ImportError(f"loading safetensors needs the safetensors package ({err})") from err
    return safe_open(str(file), framework="pt", device=device)


def _files(path: Path) -> dict[str, Path]:
    """Tensor name → shard file, from ``model.safetensors.index.json`` or every ``*.safetensors``."""
    index = path / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
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
    """:class:`~graphrt.models.checkpoint.TensorSource` for a local Hugging Face directory."""

    freq_factors = None

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        config = self.path / "config.json"
        if not config.exists():
            raise CheckpointError(f"{self.path}: no config.json")
        self.config: ModelConfig = parse_config(json.loads(config.read_text()))
        self.files = _files(self.path)

    def shapes(self) -> dict[str, Shape]:
        """Shape of every tensor, from the headers; ``CheckpointError`` on a quantised dtype."""
        out: dict[str, Shape] = {}
        for file in sorted(set(self.files.values())):
            with _safe_open(file, "cpu") as f:
                for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                    part = f.get_slice(name)
                    if part.get_dtype() not in FLOAT_DTYPES and not name.endswith("inv_freq"):
                        raise CheckpointError(
                            f"tensor {name!r} has dtype {part.get_dtype()}: quantised safetensors are not "
                            f"supported (supported: {', '.join(FLOAT_DTYPES)})"
                        )
                    out[name] = tuple(part.get_shape())
        return out

    def read(self, name: str, device: torch.device, shard: Shard) -> torch.Tensor:
        """``shard``'s rows (``dim`` 0) or columns (``dim`` 1) of ``name``, read from the file
        (all of a 0-d tensor, such as a KV scale)."""
        index = (slice(None),) * shard.dim + (slice(shard.start, shard.stop),)
        with _safe_open(self.files[name], str(device)) as f:
            if not shard.shape:
                return f.get_tensor(name).to(device)
            return f.get_slice(name)[index].to(device)

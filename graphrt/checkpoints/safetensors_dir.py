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
from graphrt.checkpoints.fp8 import SCALE, FP8Scheme, FP8Weight, companions, fp8_scheme, fp8_weights
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


def read_config(path: Path) -> tuple[ModelConfig | MLAConfig, str | None, FP8Scheme | None]:
    """The ``config.json`` of checkpoint directory ``path``, the quantization its tensors are
    dequantized from at load (:data:`~graphrt.checkpoints.mxfp4.DEQUANTIZED_AT_LOAD`, else None)
    and its FP8 scheme (:mod:`graphrt.checkpoints.fp8`, else None); :class:`CheckpointError`
    naming it when it is missing, does not parse, or holds sizes no model can have."""
    config = path / "config.json"
    if not config.exists():
        raise CheckpointError(f"{path}: no config.json")
    raw = read_json(config)
    try:
        parsed, scheme = parse_config(raw), fp8_scheme(raw)
        return parsed, None if scheme else quant_method(raw, parsed.architecture), scheme
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
    device one tensor at a time (:mod:`graphrt.checkpoints.mxfp4`). An FP8 checkpoint's weights
    (:mod:`graphrt.checkpoints.fp8`) are listed under their names without their scales; those
    the model holds in FP8 (:meth:`hold`) read as graphrt's e4m3 rows, with their per-row scales
    under ``<name>_scale``; the others dequantized to ``dtype``.
    """

    freq_factors = None

    def __init__(self, path: str | Path, dtype: torch.dtype = torch.float32) -> None:
        self.path = Path(path)
        self.dtype = dtype
        self.config, self.quant, self.fp8_scheme = read_config(self.path)
        self.files = _files(self.path)
        self.packed: dict[str, Packed] = {}
        #: The checkpoint's FP8 weights by name, and those the model keeps in FP8.
        self.fp8: dict[str, FP8Weight] = {}
        self.held: set[str] = set()
        self._rows: tuple[str, tuple[torch.Tensor, torch.Tensor]] | None = None

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
        to, an FP8 weight without its scales); ``CheckpointError`` on any other quantised dtype."""
        headers = self._headers()
        self.packed = packed_tensors(headers) if self.quant == "mxfp4" else {}
        try:
            self.fp8 = fp8_weights(headers, self.fp8_scheme) if self.fp8_scheme else {}
        except ValueError as err:
            raise CheckpointError(f"{self.path}: {err}") from None
        stored = {n for p in self.packed.values() for n in (p.blocks, p.scales)}
        stored |= {c for n in self.fp8 for c in companions(n) if c in headers}
        out: dict[str, Shape] = {name: p.shape for name, p in self.packed.items()}
        for name, (dtype, shape) in headers.items():
            if name in stored:
                continue
            if dtype not in FLOAT_DTYPES and name not in self.fp8 and not name.endswith("inv_freq"):
                raise CheckpointError(
                    f"{self.files[name]}: tensor {name!r} has dtype {dtype}: quantised safetensors are not "
                    f"supported (supported: {', '.join(FLOAT_DTYPES)}; MXFP4 experts of gpt-oss; "
                    "F8_E4M3 weights of an FP8 checkpoint)"
                )
            out[name] = shape
        return out

    def hold(self, names: set[str]) -> dict[str, Shape]:
        """Keep FP8 weights ``names`` in FP8 (read as e4m3 rows); returns their per-row scales'
        names and shapes (``<name>_scale``: ``[N]``)."""
        self.held = set(names)
        return {name + SCALE: (self.fp8[name].shape[0],) for name in sorted(names)}

    def read(self, name: str, device: torch.device, shard: Shard) -> torch.Tensor:
        """``shard``'s rows (``dim`` 0) or columns (``dim`` 1) of ``name``, read from the file
        (all of a 0-d tensor, such as a KV scale); an MXFP4 tensor dequantized to ``dtype``; an
        FP8 weight as e4m3 rows or its per-row float32 scale when held, else dequantized."""
        if name in self.packed:
            return cut(self.packed[name].read(lambda n: self._get(n, device), self.dtype), shard)
        if name in self.fp8 or name.removesuffix(SCALE) in self.held:
            return cut(self._fp8(name, device), shard)
        index = (slice(None),) * shard.dim + (slice(shard.start, shard.stop),)
        with _safe_open(self.files[name], str(device)) as f:
            if not shard.shape:
                return f.get_tensor(name).to(device)
            return f.get_slice(name)[index].to(device)

    def _fp8(self, name: str, device: torch.device) -> torch.Tensor:
        """All of FP8 weight ``name`` (e4m3 rows when held, else dequantized) or of its scale."""
        weight = name.removesuffix(SCALE) if name not in self.fp8 else name
        fp8 = self.fp8[weight]
        if weight not in self.held:
            return fp8.dequantize(self._get(weight, device), self._get(fp8.scale, device)).to(self.dtype)
        if self._rows is None or self._rows[0] != weight:  # NOTE: the weight, then its scale
            self._rows = (weight, fp8.rows(self._get(weight, device), self._get(fp8.scale, device)))
        return self._rows[1][0 if name == weight else 1]

    def _get(self, name: str, device: torch.device) -> torch.Tensor:
        with _safe_open(self.files[name], str(device)) as f:
            return f.get_tensor(name).to(device)

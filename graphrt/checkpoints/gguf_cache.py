"""A GGUF's weights converted once: dequantised, in Hugging Face layout, as one safetensors file.

``gguf_source(path, dtype)`` is the loader's source for a ``.gguf``. On a hit it reads the
cache entry's ``weights-<DTYPE>.safetensors`` (:mod:`.cache_dir`): the config and RoPE
frequency factors come from the file too, so the GGUF itself is never parsed. On a miss it is a
:class:`~graphrt.checkpoints.gguf_file.GGUFFile` until the first tensor is read: then every tensor
is dequantised, unpermuted and cast to ``dtype`` (the exact values the direct path would copy
into the model) and streamed into the file, which later reads come from.

The file holds the load dtype's values (bf16 on CUDA, float32 on the CPU): bit-identical to a
direct load, and half the bytes to read on a GPU. A file that does not open, is truncated or
has another format version is ignored and written anew.
"""

from __future__ import annotations

import json
import logging
import math
import struct
import time
from pathlib import Path
from typing import Any

import torch

from graphrt.checkpoints.cache_dir import FORMAT, entry_dir, make_room, source_id, touch, write_atomic
from graphrt.checkpoints.checkpoint import Shape, TensorSource
from graphrt.checkpoints.gguf_file import GGUFFile
from graphrt.checkpoints.hf_config import parse_config
from graphrt.models.config import ModelConfig
from graphrt.models.parallel import Shard

log = logging.getLogger("graphrt.cache")

#: Load dtype → safetensors dtype code; other dtypes load straight from the GGUF, uncached.
DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
#: The file's entry holding the GGUF's ``rope_freqs`` (not a model tensor: never in ``shapes``).
ROPE_FREQS = "graphrt.rope_freqs"


def _header(
    shapes: dict[str, Shape], code: str, itemsize: int, extra: dict[str, torch.Tensor]
) -> dict[str, Any]:
    """safetensors' JSON header: each tensor's dtype, shape and byte range, in order."""
    header: dict[str, Any] = {}
    offset = 0
    for name, shape in shapes.items():
        end = offset + math.prod(shape) * itemsize
        header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [offset, end]}
        offset = end
    for name, t in extra.items():
        end = offset + t.numel() * t.element_size()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, end]}
        offset = end
    return header


def write_weights(file: Path, gguf: GGUFFile, dtype: torch.dtype) -> None:
    """Stream every tensor of ``gguf`` into ``file`` (safetensors), one tensor in memory at a time.

    ``__metadata__`` holds the format version, the dtype, the tensor count and the config.
    """
    shapes = gguf.shapes()
    extra = {} if gguf.freq_factors is None else {ROPE_FREQS: gguf.freq_factors.float().contiguous()}
    header = _header(shapes, DTYPES[dtype], dtype.itemsize, extra)
    header["__metadata__"] = {
        "format": str(FORMAT),
        "dtype": DTYPES[dtype],
        "tensors": str(len(shapes)),
        "config": json.dumps(gguf.raw_config),
        "source": str(gguf.path),
        "source_id": source_id(gguf.path),
    }
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # NOTE: safetensors aligns the data to 8 bytes
    with open(file, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        tensors = (gguf.dequantized(n).to(dtype) for n in shapes)
        for t in (*tensors, *extra.values()):
            f.write(t.contiguous().reshape(-1).view(torch.uint8).numpy())


def _safe_open(file: Path, device: str) -> Any:
    from safetensors import safe_open

    return safe_open(str(file), framework="pt", device=device)


class CachedWeights:
    """:class:`~graphrt.checkpoints.checkpoint.TensorSource` over a converted file (see :meth:`open`)."""

    def __init__(
        self, file: Path, config: ModelConfig, freq_factors: torch.Tensor | None, shapes: dict[str, Shape]
    ) -> None:
        self.file, self.config, self.freq_factors, self._shapes = file, config, freq_factors, shapes
        self._handles: dict[str, Any] = {}

    @classmethod
    def open(cls, file: Path, dtype: torch.dtype, source: Path | None = None) -> CachedWeights | None:
        """The converted ``file`` if it is whole, of this format and ``dtype`` and (given
        ``source``) converted from that GGUF as it is now, else None (said in one warning)."""
        from safetensors import SafetensorError

        if not file.is_file():
            return None
        try:
            with _safe_open(file, "cpu") as f:
                meta = f.metadata() or {}
                if meta.get("format") != str(FORMAT) or meta.get("dtype") != DTYPES[dtype]:
                    raise ValueError(f"format {meta.get('format')}, dtype {meta.get('dtype')}")
                if source is not None and meta.get("source_id") != source_id(source):
                    raise ValueError(
                        f"converted from {meta.get('source')!r}, not from {str(source)!r} as it is now"
                    )
                names = [n for n in f.keys() if n != ROPE_FREQS]  # noqa: SIM118 - not a mapping
                if len(names) != int(meta["tensors"]):
                    raise ValueError(f"{len(names)} tensors, {meta['tensors']} written")
                shapes = {n: tuple(f.get_slice(n).get_shape()) for n in names}
                freqs = f.get_tensor(ROPE_FREQS) if ROPE_FREQS in f.keys() else None  # noqa: SIM118
            config = parse_config(json.loads(meta["config"]))
        except (SafetensorError, OSError, ValueError, KeyError, TypeError) as err:
            log.warning("graphrt cache: ignoring %s (%s); converting again", file, err)
            return None
        return cls(file, config, freqs, shapes)

    def shapes(self) -> dict[str, Shape]:
        return dict(self._shapes)

    def read(self, name: str, device: torch.device, shard: Shard) -> torch.Tensor:
        """``shard``'s rows or columns of ``name``, read from the file straight onto ``device``."""
        handle = self._handles.get(str(device))
        if handle is None:
            handle = self._handles[str(device)] = _safe_open(self.file, str(device))
        if not shard.shape:
            return handle.get_tensor(name).to(device)
        index = (slice(None),) * shard.dim + (slice(shard.start, shard.stop),)
        return handle.get_slice(name)[index].to(device)


class ConvertingGGUF:
    """A GGUF not yet in the cache: checked as the GGUF itself; converted on the first read."""

    def __init__(self, gguf: GGUFFile, file: Path, dtype: torch.dtype) -> None:
        self.gguf, self.file, self.dtype = gguf, file, dtype
        self.config, self.freq_factors = gguf.config, gguf.freq_factors
        self._source: TensorSource | None = None

    def shapes(self) -> dict[str, Shape]:
        return self.gguf.shapes()

    def read(self, name: str, device: torch.device, shard: Shard) -> torch.Tensor:
        if self._source is None:
            self._source = self._convert() or self.gguf
        return self._source.read(name, device, shard)

    def _convert(self) -> CachedWeights | None:
        """Write the cache file (within the size bound) and open it; None where it was not."""
        need = sum(math.prod(s) for s in self.gguf.shapes().values()) * self.dtype.itemsize
        if not make_room(need, self.file):
            log.info(
                "graphrt cache: %s not cached (%.2f GiB > GRAPHRT_CACHE_MAX_GB)", self.file, need / 2**30
            )
            return None
        start = time.perf_counter()
        if not write_atomic(self.file, lambda tmp: write_weights(tmp, self.gguf, self.dtype)):
            return None
        log.info("graphrt cache: converted %s in %.2f s", self.gguf.path.name, time.perf_counter() - start)
        return CachedWeights.open(self.file, self.dtype)


def gguf_source(path: Path, dtype: torch.dtype) -> TensorSource:
    """The tensors of GGUF ``path`` for a model in ``dtype``: cached, converting, or direct
    (cache off, or a dtype the cache does not hold)."""
    entry = entry_dir(path)
    if entry is None or dtype not in DTYPES:
        return GGUFFile(path)
    file = entry / f"weights-{DTYPES[dtype]}.safetensors"
    hit = CachedWeights.open(file, dtype, path)
    if hit is not None:
        touch(file)
        return hit
    return ConvertingGGUF(GGUFFile(path), file, dtype)

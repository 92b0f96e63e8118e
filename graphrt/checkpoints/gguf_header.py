"""A GGUF file's header walked with every length checked against the file, before ``gguf`` reads it.

The ``gguf`` package's reader trusts the header: a file cut short raises ``IndexError`` or
"cannot reshape array", and a count of ``2**40`` key/values or array items past the end of
the file loops for ever (a read past the end gives an empty array, which advances nothing).
:func:`check_gguf` walks the same layout — magic, version, counts, key/values, tensor infos,
alignment, tensor data ranges — and raises :class:`CheckpointError` naming the file, the
offset and the fault; a file it passes is one the reader can index.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

import numpy as np

from graphrt.checkpoints.errors import CheckpointError

MAGIC = b"GGUF"
VERSIONS = (2, 3)
#: GGUF value types: scalar sizes in bytes (8: string, 9: array have none).
SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY = 8, 9
MAX_DIMS = 4  # NOTE: GGML_MAX_DIMS
#: Arrays of arrays nest at most this deep (llama.cpp writes one level; a damaged type could
#: otherwise recurse once per 12 bytes of the file).
MAX_NESTING = 8
DEFAULT_ALIGNMENT = 32


class _Cursor:
    """Little-endian reads from a memory map, each bounded by the file's end.

    NOTE: a plain ``mmap`` sliced to ``bytes``: SmolLM2's header holds ~100k strings (its
    vocabulary and merges), and ``np.memmap`` slicing runs Python code on each.
    """

    def __init__(self, path: Path, data: mmap.mmap) -> None:
        self.path, self.data, self.pos, self.size = path, data, 0, len(data)

    def fail(self, what: str) -> CheckpointError:
        return CheckpointError(f"{self.path}: not a readable GGUF file: {what} (offset {self.pos})")

    def take(self, n: int, what: str) -> bytes:
        start = self.skip(n, what)
        return self.data[start : self.pos]

    def skip(self, n: int, what: str) -> int:
        """Step over ``n`` bytes; returns where they start."""
        if n < 0 or self.pos + n > self.size:
            raise self.fail(
                f"{what} needs {n} bytes, the file ends {self.size - self.pos} bytes on (cut short?)"
            )
        self.pos += n
        return self.pos - n

    def u32(self, what: str) -> int:
        return struct.unpack("<I", self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack("<Q", self.take(8, what))[0]

    def string(self, what: str) -> str:
        raw = self.take(self.u64(f"{what} length"), what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise self.fail(f"{what} is not UTF-8 ({err.reason})") from None

    def skip_value(self, kind: int, what: str, depth: int = 0) -> int | None:
        """Step over one value of type ``kind``; returns it when it is a u32 (the alignment)."""
        if kind == 4:
            return self.u32(what)
        if kind in SCALAR_SIZES:
            self.skip(SCALAR_SIZES[kind], what)
            return None
        if kind == STRING:
            self.skip(self.u64(f"{what} length"), what)
            return None
        if kind != ARRAY:
            raise self.fail(f"{what} has unknown value type {kind}")
        if depth >= MAX_NESTING:
            raise self.fail(f"{what} nests arrays more than {MAX_NESTING} deep")
        item, count = self.u32(f"{what} item type"), self.u64(f"{what} length")
        if item in SCALAR_SIZES:
            self.skip(count * SCALAR_SIZES[item], what)  # NOTE: bounded by the file, no loop
            return None
        if count > (self.size - self.pos) // 8:
            raise self.fail(f"{what} claims {count} items, more than the rest of the file holds")
        for _ in range(count):
            self.skip_value(item, what, depth + 1)
        return None


def check_gguf(path: Path) -> None:
    """Raise :class:`CheckpointError` when ``path`` is not a complete, well-formed GGUF file."""
    size = path.stat().st_size
    if size < 24:
        raise CheckpointError(f"{path}: not a readable GGUF file: {size} bytes, shorter than a GGUF header")
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        _walk(_Cursor(path, data), path, size)


def _walk(cur: _Cursor, path: Path, size: int) -> None:
    """Magic, version, counts, key/values, tensor infos and data ranges, in file order."""
    if cur.take(4, "magic") != MAGIC:
        raise cur.fail("wrong magic (not a GGUF file)")
    version = cur.u32("version")
    if version not in VERSIONS:
        raise cur.fail(f"GGUF version {version} (supported: {', '.join(map(str, VERSIONS))})")
    tensors, kvs = cur.u64("tensor count"), cur.u64("key/value count")
    for count, what, least in ((tensors, "tensors", 24), (kvs, "key/values", 13)):
        if count > (size - cur.pos) // least:
            raise cur.fail(
                f"the header claims {count} {what}, more than a file of {size} bytes can hold "
                "(a damaged count, or the file is cut short)"
            )
    alignment = DEFAULT_ALIGNMENT
    for i in range(kvs):
        key = cur.string(f"key {i}")
        kind = cur.u32(f"type of {key!r}")
        value = cur.skip_value(kind, f"value of {key!r}")
        if key == "general.alignment":
            if value is None or value == 0 or value & (value - 1):
                raise cur.fail(f"general.alignment must be a u32 power of two, got {value}")
            alignment = value
    infos = [_tensor_info(cur, i) for i in range(tensors)]
    start = -(-cur.pos // alignment) * alignment
    for name, n_bytes, offset in infos:
        if offset % alignment:
            raise cur.fail(f"tensor {name!r} data offset {offset} is not a multiple of {alignment}")
        if start + offset + n_bytes > size:
            raise CheckpointError(
                f"{path}: not a readable GGUF file: tensor {name!r} data at offset {start + offset} "
                f"({n_bytes} bytes) runs past the end of the file ({size} bytes: cut short?)"
            )


def _tensor_info(cur: _Cursor, i: int) -> tuple[str, int, int]:
    """``(name, data bytes, data offset)`` of tensor info ``i``."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    name = cur.string(f"tensor {i} name")
    n_dims = cur.u32(f"tensor {name!r} dimension count")
    if not 1 <= n_dims <= MAX_DIMS:
        raise cur.fail(f"tensor {name!r} has {n_dims} dimensions (1..{MAX_DIMS})")
    dims = [cur.u64(f"tensor {name!r} dimension") for _ in range(n_dims)]
    kind = cur.u32(f"tensor {name!r} type")
    offset = cur.u64(f"tensor {name!r} offset")
    try:
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
    except (ValueError, KeyError):
        raise cur.fail(f"tensor {name!r} has unknown type {kind}") from None
    elements = int(np.prod(dims, dtype=object))
    if dims[0] % block:
        raise cur.fail(
            f"tensor {name!r}: {dims[0]} values a row is not a whole number of {block}-value blocks"
        )
    return name, elements // block * type_size, offset

"""Declarative buffer specs: name, symbolic shape, dtype and the rule for padded rows."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache

import torch

#: Symbols a shape may use. Dim 0 of a buffer is its batch axis; only dim 0 shrinks per bucket.
SYMBOLS = ("max_bs", "max_tokens", "max_pages", "max_context_len")


@dataclass(frozen=True, slots=True)
class Dims:
    """Values of the symbolic dims.

    At allocation they are the maxima; for a bucket view ``max_bs`` is the bucket and
    ``max_tokens`` the bucket's token count, so the same spec yields both shapes.
    """

    max_bs: int
    max_tokens: int
    max_pages: int
    max_context_len: int

    def for_bucket(self, bucket: int, rows_per_req: int, tokens: int | None = None) -> Dims:
        """The dims of a bucket of ``bucket`` rows and ``bucket * rows_per_req`` token rows, or
        ``tokens`` token rows when given (a token-bucketed graph)."""
        return replace(self, max_bs=bucket, max_tokens=bucket * rows_per_req if tokens is None else tokens)

    def resolve(self, dim: str | int) -> int:
        """Evaluate ``"max_bs"``, ``"max_bs+1"``, ``"4*max_bs+8"`` or a plain int."""
        if isinstance(dim, int):
            return dim
        scale, name, offset = _parse(dim)
        return scale * getattr(self, name) + offset


@cache
def _parse(dim: str) -> tuple[int, str, int]:
    """``"4*max_bs+1"`` -> ``(4, "max_bs", 1)``, parsed once per distinct symbol.

    NOTE: once, so a call allocates nothing: on the H100 the soak test found the strings split
    here on every call kept alive (230 of ~47 B over 300 steps, who kept them unknown).
    """
    term, _, offset = dim.partition("+")
    scale, _, name = term.rpartition("*")
    if name not in SYMBOLS:
        raise ValueError(f"unknown dim symbol {name!r}; known: {', '.join(SYMBOLS)}")
    return int(scale) if scale else 1, name, int(offset) if offset else 0


@dataclass(frozen=True, slots=True)
class PadRule:
    """What rows ``bs..bucket`` (the dummy requests) must hold.

    ``kind="const"``: every element equals ``value`` (an int, or a symbol such as
    ``"dummy_slot"`` resolved by the owner). ``kind="step"``: the buffer keeps rising by
    ``value`` per padded row (cumulative lengths stay monotone). ``kind="free"``: no rule
    (outputs, scratch).
    """

    kind: str
    value: int | float | str = 0

    def __post_init__(self) -> None:
        if self.kind not in ("const", "step", "free"):
            raise ValueError(f"pad kind must be const, step or free, got {self.kind!r}")


@dataclass(frozen=True, slots=True)
class BufferSpec:
    """One static tensor.

    Parameters
    ----------
    name : str
        Attribute name on the view object.
    shape : tuple of str | int
        Symbolic shape, e.g. ``("max_bs", "max_pages")``; dim 0 is the batch axis.
    dtype : torch.dtype
    pad : PadRule
        Rule for padded rows; checked by :meth:`StaticBuffers.pad_violations`.
    host : bool
        Written on the host and copied to the device in one transfer per step; otherwise
        derived on the device (inside the captured graph) from host-written buffers.
    head_only : bool
        Written inside the graph from its start up to a length the writer decides (FA3's tile
        schedule); the tail is never read, so debug mode's poison check looks at the head only.
    scratch : bool
        Written and read inside the graph by one kernel path that some buckets do not take (a
        workspace, not a step input: MoE's expert alignment, which the smallest steps skip);
        debug mode's poison check skips it, its pad rule still holds where written.
    """

    name: str
    shape: tuple[str | int, ...]
    dtype: torch.dtype
    pad: PadRule
    host: bool = False
    head_only: bool = False
    scratch: bool = False

    def size(self, dims: Dims) -> tuple[int, ...]:
        return tuple(dims.resolve(d) for d in self.shape)

    def nbytes(self, dims: Dims) -> int:
        n = 1
        for d in self.size(dims):
            n *= d
        return n * torch.empty((), dtype=self.dtype).element_size()

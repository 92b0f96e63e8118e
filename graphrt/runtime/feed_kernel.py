"""The token feed's two Triton kernels (:mod:`graphrt.runtime.feed`), one graph node each.

Both see the whole bucket (``n`` request rows) and decide per row from its host-written input
id: a row whose id is ``FED`` (negative) gathers its token from ``last[rows[r]]`` and records the
token it sampled there; any other row (given ids, pad rows) keeps its id and records nothing.
The torch ops of :class:`~graphrt.runtime.feed.TokenFeed` are their oracle.
"""

from __future__ import annotations

import torch

from graphrt.kernels.switches import tl, triton, triton_enabled

#: Request rows per program (a DECODE bucket rarely has more: one program).
BLOCK = 256
#: The switch of these kernels (:mod:`graphrt.kernels.switches`).
ENV = "GRAPHRT_FUSED_FEED"


def fused_feed(device: torch.device) -> bool:
    """Whether the feed on ``device`` runs the Triton kernels (CUDA, Triton importable)."""
    return triton_enabled(ENV, device)


if triton is not None:

    @triton.jit
    def _gather(last, ids, rows, out, n, BLOCK_ROWS: tl.constexpr):
        offs = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        ok = offs < n
        given = tl.load(ids + offs, mask=ok, other=0)
        fed = ok & (given < 0)
        row = tl.load(rows + offs, mask=fed, other=0)
        token = tl.load(last + row, mask=fed, other=0)
        tl.store(out + offs, tl.where(fed, token, given), mask=ok)

    @triton.jit
    def _record(last, ids, rows, sampled, n, BLOCK_ROWS: tl.constexpr):
        offs = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        ok = offs < n
        fed = ok & (tl.load(ids + offs, mask=ok, other=0) < 0)
        row = tl.load(rows + offs, mask=fed, other=0)
        token = tl.load(sampled + offs, mask=fed, other=0)
        tl.store(last + row, token, mask=fed)


def gather_kernel(last: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``out[r] = last[rows[r]] if ids[r] < 0 else ids[r]``; ``ids``, ``rows`` ``[n]`` int64."""
    assert triton is not None, "the fused feed needs Triton"
    n = ids.shape[0]
    out = torch.empty_like(ids)
    _gather[(triton.cdiv(max(n, 1), BLOCK),)](last, ids, rows, out, n, BLOCK_ROWS=BLOCK)
    return out


def record_kernel(last: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor, sampled: torch.Tensor) -> None:
    """``last[rows[r]] = sampled[r]`` where ``ids[r] < 0``; ``sampled [n]`` int64."""
    assert triton is not None, "the fused feed needs Triton"
    n = ids.shape[0]
    _record[(triton.cdiv(max(n, 1), BLOCK),)](last, ids, rows, sampled, n, BLOCK_ROWS=BLOCK)

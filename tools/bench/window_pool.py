"""KV pool bytes with and without the window-layer pool (:mod:`graphrt.kv.window`); no GPU needed.

``python -m graphrt.tools.bench.window_pool`` prints ``tiny-llama-swa`` (as the tests build it)
and a Gemma-2-9B-like shape (42 layers, every other one a 4096-position window, 8 KV heads of
256, bf16) at 32k context, for 1 and 64 requests. The window pool holds ``window + step``
positions per request plus one prefill of ``prefill_tokens`` (default: the context) at once.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from graphrt.kv.window import window_pool_pages


@dataclass(frozen=True, slots=True)
class PoolShape:
    """A model's KV geometry: ``layers`` of which ``window_layers`` see ``window`` positions."""

    name: str
    layers: int
    window_layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    window: int


TINY_SWA = PoolShape("tiny-llama-swa", 4, 2, 2, 64, 4, 24)  # NOTE: fp32 on the CPU
GEMMA2_9B = PoolShape("gemma-2-9b-like", 42, 21, 8, 256, 2, 4096)


def pool_bytes(
    shape: PoolShape,
    *,
    context: int,
    max_reqs: int,
    page_size: int = 16,
    step: int = 1,
    prefill_tokens: int | None = None,
) -> tuple[int, int]:
    """``(full, pooled)``: bytes of every layer's K and V (dummy pages included) when window
    layers keep the full context, and when they keep a window pool instead."""
    per_slot = 2 * shape.kv_heads * shape.head_dim * shape.dtype_bytes
    full_slots = (max_reqs * -(-context // page_size) + 1) * page_size
    prefill = context if prefill_tokens is None else prefill_tokens
    window_slots = window_pool_pages(shape.window, step, page_size, max_reqs, prefill) * page_size
    full = shape.layers * per_slot * full_slots
    pooled = (shape.layers - shape.window_layers) * per_slot * full_slots
    return full, pooled + shape.window_layers * per_slot * window_slots


def rows(context: int, page_size: int, step: int) -> list[tuple[str, int, int, int, int]]:
    """``(shape, context, requests, full bytes, pooled bytes)`` for the two shapes."""
    cases = [(TINY_SWA, 96, 4, 4), (GEMMA2_9B, context, 1, page_size), (GEMMA2_9B, context, 64, page_size)]
    out = []
    for shape, ctx, reqs, ps in cases:
        full, pooled = pool_bytes(shape, context=ctx, max_reqs=reqs, page_size=ps, step=step)
        out.append((shape.name, ctx, reqs, full, pooled))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=32768)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--step", type=int, default=1, help="positions one step writes per request")
    args = parser.parse_args(argv)
    print(f"{'shape':<18}{'context':>8}{'reqs':>6}{'full MiB':>12}{'pooled MiB':>12}{'saved':>8}")
    for name, ctx, reqs, full, pooled in rows(args.context, args.page_size, args.step):
        saved = 1 - pooled / full
        print(f"{name:<18}{ctx:>8}{reqs:>6}{full / 2**20:>12.1f}{pooled / 2**20:>12.1f}{saved:>8.1%}")


if __name__ == "__main__":
    main()

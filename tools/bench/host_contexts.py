"""``graphrt bench host``: ``run()``'s host time per ``max_context_len``, the samples interleaved.

Issue 25 wants ``run()`` within 5 % between a 4k and a 128k ``max_context_len``. Rows measured
one context after the other compare two stretches of the host's time; on the H100 host the
launch floor doubled between them once. Here each DECODE batch size times the steady state of
every context's runtime in turn (:func:`~graphrt.tools.bench.profile_host.interleaved_steady_us`),
so drift weighs on each alike, and reports the ratio of the widest to the narrowest.
"""

from __future__ import annotations

import numpy as np
from rich.console import Console
from rich.table import Table

from graphrt import GraphRuntime
from graphrt.tools.bench.profile_host import SteadyDecode, interleaved_steady_us


def compare_contexts(
    runtimes: dict[int, GraphRuntime], page_size: int, sizes: list[int], real: int, iters: int
) -> list[dict]:
    """Per batch size: ``run()`` p50/p99 µs of each context's runtime (keys: ``max_context_len``),
    sampled in turn, and ``ratio`` = the widest context's p50 over the narrowest's."""
    rows = []
    for bs in sizes:
        pairs = [(rt, SteadyDecode(rt, bs, real, np.random.default_rng(1))) for rt in runtimes.values()]
        samples = interleaved_steady_us(pairs, iters)
        stats = {
            ctx: {"p50": float(np.percentile(s, 50)), "p99": float(np.percentile(s, 99))}
            for ctx, s in zip(runtimes, samples, strict=True)
        }
        ratio = stats[max(stats)]["p50"] / stats[min(stats)]["p50"]
        rows.append({"mode": "decode", "page_size": page_size, "bs": bs, "run": stats, "ratio": ratio})
    return rows


def print_contexts(rows: list[dict]) -> None:
    """A table of :func:`compare_contexts`' rows (nothing when there are none)."""
    if not rows:
        return
    contexts = sorted(rows[0]["run"])
    table = Table(title="run() host µs p50 (p99) by max_context_len, samples interleaved")
    for col in ("ps", "bs", *(f"ctx {c}" for c in contexts), "widest / narrowest"):
        table.add_column(col, justify="right")
    for r in rows:
        cells = (f"{r['run'][c]['p50']:.1f} ({r['run'][c]['p99']:.0f})" for c in contexts)
        table.add_row(str(r["page_size"]), str(r["bs"]), *cells, f"{r['ratio']:.3f}")
    Console(width=160).print(table)

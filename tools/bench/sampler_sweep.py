"""``graphrt bench sampler --sweep``: the fused sampler's layouts (chunk, warps, records, ...) at bs 1.

The kernels cut a row into chunks of ``chunk`` entries, one program each; the row's last program
merges the chunks' records (at most ``records`` each) alone. Larger chunks mean fewer programs
(13 for a 49k vocabulary at 4096: a tenth of an H100's SMs) and longer serial reductions in
each; smaller ones fill the GPU but give the merge more records to walk. This times
:data:`SWEEP`'s layouts for each vocabulary and kind of rows, each captured in a graph as the
plain bench does, and checks every layout's tokens against the torch sampler. The best layout
per vocabulary (the smallest worst case over the kinds) is what
the tuning table's ``sampler_layouts`` hold (:mod:`graphrt.kernels.tuning`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import numpy as np
import torch
from rich.table import Table

from graphrt.metadata.sampling import sampling_inputs
from graphrt.runtime.sampler.draw import sample_torch
from graphrt.runtime.sampler.launch import Layout, fused_sample, layout_for

#: Candidates ``(chunk, warps, records, tally, scan_warps)`` (scan_warps 0: ``warps``).
SWEEP = tuple(
    Layout(c, w, r, t, sw)
    for c, w, r, t, sw in [(4096, 16, 16, 4, 0), (4096, 8, 16, 4, 16), (2048, 8, 16, 4, 0), (2048, 8, 8, 4, 0),
                           (2048, 8, 8, 2, 0), (2048, 8, 16, 4, 16), (2048, 8, 8, 4, 16), (2048, 4, 8, 4, 8),
                           (2048, 16, 8, 4, 0), (2048, 8, 4, 4, 0), (2048, 8, 4, 4, 16), (1024, 8, 8, 4, 0),
                           (1024, 4, 8, 4, 8), (1024, 8, 16, 4, 4)]
)  # fmt: skip


def sweep_layouts(
    vocabs: list[int], kinds: dict[str, Any], logits_for: Callable[[int, int], torch.Tensor],
    graph_us: Callable[[Callable[[], Any]], dict[str, float]],
) -> list[dict[str, Any]]:  # fmt: skip
    """One row per (vocabulary, layout): µs p50 per kind of rows, tokens equal to torch's."""
    rows = []
    for vocab in vocabs:
        logits = logits_for(1, vocab)
        cases = {
            kind: sampling_inputs([params], np.array([5]), logits.device) for kind, params in kinds.items()
        }
        expected = {kind: sample_torch(logits, p) for kind, p in cases.items()}
        for layout in SWEEP:
            row: dict[str, Any] = {"vocab": vocab, "layout": asdict(layout), "us": {}, "tokens_equal": True}
            for kind, params in cases.items():
                got = fused_sample(logits, params, layout=layout)
                row["tokens_equal"] &= bool(torch.equal(got, expected[kind]))
                row["us"][kind] = graph_us(
                    lambda x=logits, p=params, lay=layout: fused_sample(x, p, layout=lay)
                )["p50"]
            row["worst_us"] = max(row["us"].values())
            rows.append(row)
    return rows


def best_layouts(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Per vocabulary: the layout with the smallest worst case, and the current default's row."""
    best: dict[int, dict[str, Any]] = {}
    for vocab in sorted({r["vocab"] for r in rows}):
        mine = [r for r in rows if r["vocab"] == vocab and r["tokens_equal"]]
        current = asdict(layout_for(vocab))
        default = next((r for r in mine if r["layout"] == current), None)
        winner = min(mine, key=lambda r: r["worst_us"]) if mine else None
        best[vocab] = {"best": winner, "current": default}
    return best


def sweep_table(rows: list[dict[str, Any]], kinds: list[str]) -> Table:
    table = Table(title="fused sampler layouts at bs 1 (µs p50 per call in a CUDA graph)")
    for col in ("vocab", "chunk", "warps", "records", "tally", "scan_warps", *kinds, "worst", "tokens"):
        table.add_column(col, justify="right")
    for r in rows:
        lay = r["layout"]
        cells = (f"{r['us'][k]:.1f}" for k in kinds)
        same = "same" if r["tokens_equal"] else "DIFFER"
        table.add_row(str(r["vocab"]), *(str(lay[k]) for k in ("chunk", "warps", "records", "tally", "scan_warps")), *cells,
                      f"{r['worst_us']:.1f}", same)  # fmt: skip
    return table

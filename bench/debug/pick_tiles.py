"""One skinny GEMM tile per ``M`` class from a ``graphrt bench gemm --sweep`` JSON.

For each ``M`` of the sweep and each candidate of ``gemm.SWEEP`` (fitted to every projection as
the kernel fits it), sums the candidate's p50 µs over all projections of both models and compares
it with cuBLAS's sum; prints the table and, last, the ``GRAPHRT_SKINNY_TILES`` spec of the tiles
with the smallest sums (``16=NxKwWsS,64=...``), so a script can A/B the model steps with it.

Run: ``PYTHONPATH=$PWD python bench/debug/pick_tiles.py bench/results/.../gemm_cuda_*.json``.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path

from graphrt.kernels import skinny
from graphrt.tools.bench.gemm import SWEEP


def sums(rows: list[dict]) -> dict[int, dict[str, float]]:
    """``{M: {"cublas": µs, "<tile spec>": µs}}`` summed over the rows where every path was timed."""
    out: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for row in rows:
        m, n, k = row["m"], row["n"], row["k"]
        if m == 1 or "sweep" not in row:
            continue
        timed = {json.dumps(c["tile"], sort_keys=True): c["us"]["p50"] for c in row["sweep"]}
        out[m]["cublas"] += row["paths"]["cublas"]["us"]["p50"]
        for cand in SWEEP[skinny.m_class(m)]:
            fit = json.dumps(asdict(cand.fit(m, n, k)), sort_keys=True)
            out[m][spec(cand)] += timed.get(fit, float("inf"))
    return out


def spec(tile: skinny.Tile) -> str:
    return f"{tile.block_n}x{tile.block_k}w{tile.warps}s{tile.stages}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", help="a gemm_cuda_*.json written with --sweep")
    rows = json.loads(Path(parser.parse_args().json).read_text())["rows"]
    best = {}
    for m, cells in sorted(sums(rows).items()):
        cublas = cells.pop("cublas")
        for name, us in sorted(cells.items(), key=lambda kv: kv[1]):
            print(f"M={m:<3} {name:<14} {us:9.1f} µs  ({us / cublas:.3f}× cuBLAS {cublas:.1f} µs)")
        best[skinny.m_class(m)] = min(cells, key=cells.get)
    print(",".join(f"{m}={name}" for m, name in sorted(best.items())))


if __name__ == "__main__":
    main()

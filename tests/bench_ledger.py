"""Host cost of KV isolation per DECODE step: ``KVWrites.of`` + ``KVLedger.check`` + ``commit``.

``python -m tests.bench_ledger [--against REV]`` prints p50/p90 µs per batch size on this
machine; with ``--against`` (e.g. ``main``) the ledger of that git revision runs the same
batches in the same process, interleaved, and the table shows both and their ratio. Every
row holds about ``REAL`` positions and each timed step writes the next one (the decode steady
state); the batches are built before timing, as ``graphrt bench host`` does for ``validate``.

Workloads: ``append`` (every row at the same position), ``stagger`` (rows 0..15 positions
apart, so some row opens a page at most steps), ``rewrite`` (each step writes the same
position again: a verify rewriting its rejected drafts drops the row's tail). Page sizes 1
and 16.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import numpy as np

from graphrt import Batch, ForwardMode
from graphrt.kv import ledger as current

CONTEXT, REAL, STEPS = 4096, 512, 2000
KINDS = ("append", "stagger", "rewrite")


def lens_of(bs: int, kind: str) -> np.ndarray:
    return REAL + (np.arange(bs) % 16 if kind == "stagger" else np.zeros(bs, dtype=np.int64))


def decode(lens: np.ndarray) -> Batch:
    """Row ``r`` (slots ``r * CONTEXT ...``) writes position ``lens[r]``."""
    rows = np.arange(lens.size)
    return Batch.create(
        ForwardMode.DECODE,
        input_ids=np.zeros(lens.size, dtype=np.int64),
        seq_lens=lens + 1,
        req_pool_indices=rows,
        out_cache_loc=rows * CONTEXT + lens,
    )


def fresh(module: ModuleType, bs: int, page_size: int, lens: np.ndarray) -> object:
    """A ledger of ``module`` whose rows hold ``lens`` positions (a prefill's state)."""
    try:
        ledger = module.KVLedger(bs, CONTEXT, bs * CONTEXT, page_size)
    except TypeError:  # NOTE: the slot ledger before pages took no page size
        ledger = module.KVLedger(bs, CONTEXT, bs * CONTEXT)
    prefill = Batch.create(
        ForwardMode.EXTEND,
        input_ids=np.zeros(int(lens.sum()), dtype=np.int64),
        seq_lens=lens,
        req_pool_indices=np.arange(bs),
        out_cache_loc=np.concatenate([r * CONTEXT + np.arange(n) for r, n in enumerate(lens)]),
        q_lens=lens,
    )
    ledger.commit(module.KVWrites.of(prefill))
    return ledger


def measure(
    bs: int, rewrite: bool = False, page_size: int = 16, kind: str | None = None, module: ModuleType = current
) -> tuple[float, float]:
    """(p50, p90) µs of one step's isolation check and commit at batch size ``bs``."""
    kind = kind or ("rewrite" if rewrite else "append")
    lens = lens_of(bs, kind)
    ledger = fresh(module, bs, page_size, lens)
    batches = [decode(lens + (0 if kind == "rewrite" else i)) for i in range(STEPS)]
    times = np.empty(STEPS)
    for i, batch in enumerate(batches):
        start = time.perf_counter()
        writes = module.KVWrites.of(batch)
        ledger.check(writes)
        ledger.commit(writes)
        times[i] = (time.perf_counter() - start) * 1e6
    warm = times[STEPS // 10 :]
    return float(np.percentile(warm, 50)), float(np.percentile(warm, 90))


def ledger_at(rev: str) -> ModuleType:
    """``graphrt/kv/ledger.py`` as it is at git revision ``rev`` (imports from this checkout)."""
    root = Path(__file__).resolve().parents[1]
    text = subprocess.run(
        ["git", "show", f"{rev}:graphrt/kv/ledger.py"], cwd=root, capture_output=True, text=True, check=True
    ).stdout
    path = Path(tempfile.mkdtemp()) / f"ledger_{rev.replace('/', '_')}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default=None, help="git revision whose ledger runs beside this one")
    args = parser.parse_args(argv)
    other = ledger_at(args.against) if args.against else None
    head = f"{'page':>4} {'workload':>8} {'bs':>4}   this p50 / p90"
    print(head + (f"   {args.against} p50 / p90   this/{args.against}" if other else ""), flush=True)
    for page_size in (1, 16):
        for kind in KINDS:
            for bs in (1, 8, 64, 256):
                ours = measure(bs, page_size=page_size, kind=kind)
                line = f"{page_size:>4} {kind:>8} {bs:>4}   {ours[0]:6.1f} / {ours[1]:6.1f}"
                if other is not None:
                    theirs = measure(bs, page_size=page_size, kind=kind, module=other)
                    line += f"   {theirs[0]:6.1f} / {theirs[1]:6.1f}   {ours[0] / theirs[0]:5.2f}x"
                print(line, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

"""Which part of the fused sampler's ``_count`` (and ``_scan``) takes the time at bs 1, 128k, top-p.

``bench/debug/sampler_kernels.py`` measured on the H100 (session-1127e): ``_scan`` 8.5 µs and
``_count`` 11.1 µs (no PDL) for the 128k top-p row, against 1.4 µs for a ``_count`` with nothing
to count. This times copies of the two kernels cut short after each phase (``STOP``), each
launched without PDL after a full ``_scan`` (so ``_count`` sees a real state), one graph of
``REPS`` pairs per cut, and reports each kernel's mean duration from the profiler:

- ``_count`` cuts: 0 state loaded; 1 + the chunk's mass and total; 2 + the tallies added to the
  row's sums (the first pass sums the total too); 3 + the arrival atomic (no decision); 4 the
  whole kernel (the last program decides and zeroes the sums). Cuts 2 and 3 leave the row's sums
  growing (no decision zeroes them): only their time is meant.
- ``_scan`` cuts: 0 chunk loaded and its top stored; 1 + the scores; 2 + the chunk's records;
  3 + the arrival atomic (no merge); 4 the whole kernel (the last program merges).

Cut kernels store a value that depends on what they computed, so the compiler keeps the work.
Run: ``PYTHONPATH=$PWD python bench/debug/sampler_cuts.py [--vocab 128256] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
import triton
import triton.language as tl
from sampler_kernels import graph_of, kernel_us  # NOTE: this folder, on sys.path when run as a script

from graphrt.metadata.sampling import sampling_inputs
from graphrt.runtime.sampler import count as sampler_count
from graphrt.runtime.sampler import kernel as sampler_kernel
from graphrt.runtime.sampler.count import _decide, _tally
from graphrt.runtime.sampler.draw import sample_torch
from graphrt.runtime.sampler.kernel import (
    COUNT,
    MIN64,
    _chunk,
    _mass,
    _merge,
    _records,
    _row_key,
    _scores,
)
from graphrt.runtime.sampler.launch import DECIDE, FRONTIER, layout_for, workspace
from graphrt.tools.bench.sampler import KINDS, zipf_logits


@triton.jit
def _count_cut(logits, stride, V, temperature, top_k, top_p, min_p, seed, position, tokens,
               frontier, state, mass, ranks, totals, arrivals, sink,
               S: tl.constexpr, S_PAD: tl.constexpr, C: tl.constexpr, GF: tl.constexpr,
               GB: tl.constexpr, GD: tl.constexpr, ACCURATE: tl.constexpr, STOP: tl.constexpr):  # fmt: skip
    r = tl.program_id(0)
    c = tl.program_id(1)
    T = tl.load(temperature + r)
    k = tl.load(top_k + r)
    p = tl.load(top_p + r)
    mp = tl.load(min_p + r)
    filtered = (T > 0) & (((k > 0) & (k < V)) | (p < 1.0) | (mp > 0.0))
    _, _, z, zkey = _chunk(logits, r, stride, c, tl.where(filtered, V, 0), C)
    gs = tl.arange(0, GB)
    todo = tl.load(state + r * 3)
    G = tl.load(state + r * 3 + 1).to(tl.int32)
    top = tl.load(state + r * 3 + 2)
    f = tl.load(frontier + r * GF + gs, mask=gs < GB - 1, other=MIN64)
    if STOP == 0:
        tl.store(sink + r * S + c, todo + G + top + tl.sum(f) + tl.max(zkey))
    elif todo == COUNT:
        m = sampler_kernel._value(top)
        q = _mass(z, m, T, ACCURATE)
        if STOP == 1:
            tl.store(sink + r * S + c, tl.sum(q))
        else:
            whole = _tally(zkey, q, f, gs < tl.minimum(G, GB - 1), mass, ranks, r * GF + gs)
            tl.atomic_add(totals + r, tl.sum(tl.where(gs == GB - 1, whole, 0)), sem="relaxed")
            for start in range(GB - 1, G, GB):
                at = start + gs
                more = tl.load(frontier + r * GF + at, mask=at < G, other=MIN64)
                _tally(zkey, q, more, at < G, mass, ranks, r * GF + at)
        if STOP >= 3:
            tl.debug_barrier()
            if tl.atomic_add(arrivals + 2 * r + 1, 1) == S - 1:
                tl.store(arrivals + 2 * r + 1, 0)
                if STOP >= 4:
                    _decide(logits, r, stride, V, T, k, p, mp, G, m, seed, position, tokens, frontier, mass,
                            ranks, totals, S, C, GF, GD, ACCURATE)  # fmt: skip


@triton.jit
def _scan_cut(logits, stride, V, temperature, top_k, top_p, min_p, seed, position, tokens,
              tops, records, counts, frontier, state, arrivals, sink,
              S: tl.constexpr, S_PAD: tl.constexpr, C: tl.constexpr, PF: tl.constexpr,
              GF: tl.constexpr, ACCURATE: tl.constexpr, STOP: tl.constexpr):  # fmt: skip
    r = tl.program_id(0)
    c = tl.program_id(1)
    ids, inb, z, zkey = _chunk(logits, r, stride, c, V, C)
    tl.store(tops + r * S + c, tl.max(zkey))
    T = tl.load(temperature + r)
    k = tl.load(top_k + r)
    p = tl.load(top_p + r)
    mp = tl.load(min_p + r)
    if STOP >= 1:
        skey = _scores(z, ids, inb, T, _row_key(tl.load(seed + r), tl.load(position + r)), ACCURATE)
        if STOP == 1:
            tl.store(sink + r * S + c, tl.max(skey))
        else:
            limit = tl.where(((k > 0) & (k < V)) | (p < 1.0) | (mp > 0.0), PF, 1)
            n, complete = _records(zkey, skey, records + (r * S + c) * PF * 2, limit)
            tl.store(counts + r * S + c, n + complete.to(tl.int32) * 256)
    if STOP >= 3:
        tl.debug_barrier()
        if tl.atomic_add(arrivals + 2 * r, 1) == S - 1:
            tl.store(arrivals + 2 * r, 0)
            if STOP >= 4:
                cs = tl.arange(0, S_PAD)
                tz = tl.load(tops + r * S + cs, mask=cs < S, other=MIN64, cache_modifier=".cg")
                _merge(r, V, T, k, p, mp, tokens, records, counts, frontier, state, tz,
                       S, S_PAD, PF, GF, ACCURATE)  # fmt: skip


def _durations(fn, stream: torch.cuda.Stream) -> dict[str, float]:
    return {name: round(us, 2) for name, us in kernel_us(graph_of(fn, stream)).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    device = torch.device("cuda")
    logits = zipf_logits(1, args.vocab, device, seed=7 + args.vocab)
    params = sampling_inputs([KINDS["top_p=0.9"]], np.arange(1) * 13 + 5, device)
    layout = layout_for(args.vocab)
    chunks = triton.cdiv(args.vocab, layout.chunk)
    ws = workspace(1, chunks, device, layout.records)
    tokens = torch.empty(1, dtype=torch.int64, device=device)
    sink = torch.empty(chunks, dtype=torch.int64, device=device)
    p = params
    rowwise = (p.temperature, p.top_k, p.top_p, p.min_p, p.seed, p.position, tokens)
    shape = {"S": chunks, "S_PAD": triton.next_power_of_2(chunks), "C": layout.chunk, "GF": FRONTIER,
             "ACCURATE": True, "num_warps": layout.warps, "enable_fp_fusion": False}  # fmt: skip
    grid = (1, chunks)

    def scan(stop: int = 4) -> None:
        if stop == 4:
            sampler_kernel._scan[grid](logits, logits.stride(0), args.vocab, *rowwise, ws.tops, ws.records,
                                       ws.counts, ws.frontier, ws.state, ws.arrivals, PF=layout.records,
                                       PDL=False, **shape)  # fmt: skip
        else:
            _scan_cut[grid](logits, logits.stride(0), args.vocab, *rowwise, ws.tops, ws.records, ws.counts,
                            ws.frontier, ws.state, ws.arrivals, sink, PF=layout.records, STOP=stop, **shape)  # fmt: skip

    def count(stop: int) -> None:
        _count_cut[grid](logits, logits.stride(0), args.vocab, *rowwise, ws.frontier, ws.state, ws.mass,
                         ws.ranks, ws.totals, ws.arrivals, sink, GB=min(layout.tally, FRONTIER),
                         GD=min(DECIDE, FRONTIER), STOP=stop, **shape)  # fmt: skip

    def real_count() -> None:
        sampler_count._count[grid](logits, logits.stride(0), args.vocab, *rowwise, ws.frontier, ws.state,
                                   ws.mass, ws.ranks, ws.totals, ws.arrivals, GB=min(layout.tally, FRONTIER),
                                   GD=min(DECIDE, FRONTIER), PDL=False, **shape)  # fmt: skip

    stream = torch.cuda.Stream(device)
    want = sample_torch(logits, params)
    scan()
    real_count()
    torch.cuda.synchronize()
    state = ws.state[0].tolist()
    result = {"device": torch.cuda.get_device_name(), "vocab": args.vocab, "layout": str(layout),
              "state_after_scan": state, "same_token_as_torch": bool(torch.equal(tokens, want))}  # fmt: skip
    print(result)
    result["count_cuts"] = {}

    def zero_sums() -> None:  # NOTE: cuts 2 and 3 add to the row's sums and never zero them
        for sums in (ws.mass, ws.ranks, ws.totals):
            sums.zero_()

    for stop in range(5):
        zero_sums()
        result["count_cuts"][stop] = _durations(lambda s=stop: (scan(), count(s)), stream)
        print("count STOP", stop, result["count_cuts"][stop])
    zero_sums()
    result["real"] = _durations(lambda: (scan(), real_count()), stream)
    print("real", result["real"])
    result["scan_cuts"] = {}
    for stop in range(5):
        result["scan_cuts"][stop] = _durations(lambda s=stop: scan(s), stream)
        print("scan STOP", stop, result["scan_cuts"][stop])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()

"""The fused sampler's second launch, ``_count``: what ranks before each of a row's records.

For rows :mod:`graphrt.runtime.sampler_kernel`'s ``_scan`` left waiting (state COUNT: top-k /
top-p rows whose score-best token is not rank 0), each program of the grid ``(rows, chunks)``
counts, for every record of its row at once, the tokens of its chunk ranked before it and their
mass (a ``[chunk, GB]`` comparison summed over the chunk, ``GB`` records a pass; a row has few),
and the chunk's whole mass. The row's last program to arrive adds them up and writes the lowest
kept record (:func:`_decide`), or walks on past the last record known (:func:`_walk`).

A program loads its row's parameters and (rows with a filter: only they can wait for a count)
its chunk of logits before it waits for ``_scan`` (with PDL, while ``_scan`` still runs): they
are ``_scan``'s input, not its output.
"""

from __future__ import annotations

from graphrt.step.switches import tl, triton

if triton is not None:
    from graphrt.runtime.sampler_kernel import (
        COUNT,
        MIN64,
        _chunk,
        _kept,
        _log_min_p,
        _mass,
        _row_key,
        _scores,
        _token,
        _value,
    )

    @triton.jit
    def _walk(logits, r, stride, V, T, key, cur, m, k, limit, L, S: tl.constexpr, C: tl.constexpr,
              ACCURATE: tl.constexpr):  # fmt: skip
        """Records above ``cur``, one at a time over the whole row, until one is kept: its token."""
        answer = tl.full([], -1, tl.int64)
        while answer < 0:
            best = tl.full([], MIN64, tl.int64)
            up = tl.full([], MIN64, tl.int64)
            for c in range(0, S):
                ids, inb, z, zkey = _chunk(logits, r, stride, c, V, C)
                skey = _scores(z, ids, inb, T, key, ACCURATE)
                b = tl.max(tl.where(zkey > cur, skey, MIN64))
                up = tl.where(b > best, tl.max(tl.where(skey == b, zkey, MIN64)), up)
                best = tl.maximum(best, b)
            rank = tl.full([], 0, tl.int64)
            before = tl.full([], 0, tl.int64)
            for c in range(0, S):
                _, _, z, zkey = _chunk(logits, r, stride, c, V, C)
                ahead = zkey > up
                rank += tl.sum(ahead.to(tl.int64))
                before += tl.sum(tl.where(ahead, _mass(z, m, T, ACCURATE), 0))
            d = tl.math.div_rn(_value(up) - m, T)
            answer = tl.where(_kept(rank, before, d, k, limit, L), _token(up), answer)
            cur = up
        return answer

    @triton.jit
    def _decide(logits, r, stride, V, T, k, p, mp, G, m, seed, position, tokens, frontier, mass, ranks, totals,
                S: tl.constexpr, S_PAD: tl.constexpr, C: tl.constexpr, GF: tl.constexpr,
                ACCURATE: tl.constexpr):  # fmt: skip
        """Row ``r``'s token: its lowest kept record (or :func:`_walk` past the last one known)."""
        cs = tl.arange(0, S_PAD)
        gs = tl.arange(0, GF)
        both = (cs[:, None] < S) & (gs[None, :] < G)
        at = (r * S + cs[:, None]) * GF + gs[None, :]
        before = tl.sum(tl.load(mass + at, mask=both, other=0, cache_modifier=".cg"), axis=0)
        rank = tl.sum(tl.load(ranks + at, mask=both, other=0, cache_modifier=".cg"), axis=0)
        total = tl.sum(tl.load(totals + r * S + cs, mask=cs < S, other=0, cache_modifier=".cg"))
        fz = tl.load(frontier + r * GF + gs, mask=gs < G, other=MIN64)
        k = tl.where((k > 0) & (k < V), k, V)
        limit = tl.where(p < 1.0, p.to(tl.float64) * total.to(tl.float64), float("inf"))
        L = _log_min_p(mp, ACCURATE)
        keep = _kept(rank, before, tl.math.div_rn(_value(fz) - m, T), k, limit, L) & (gs < G)
        first = tl.min(tl.where(keep, gs, GF))
        answer = tl.max(tl.where(gs == first, _token(fz), -1))
        if first == GF:  # NOTE: none of the known records is kept: the row's records were cut short
            cur = tl.max(tl.where(gs == G - 1, fz, MIN64))
            key = _row_key(tl.load(seed + r), tl.load(position + r))
            answer = _walk(logits, r, stride, V, T, key, cur, m, k, limit, L, S, C, ACCURATE)
        tl.store(tokens + r, answer)

    @triton.jit
    def _tally(zkey, q, f, live, mass, ranks, at):
        """Store, for each record ``f`` [GB] (``live`` ones), the chunk's mass and count ranked before it."""
        packed = tl.sum(tl.where(zkey[:, None] > f[None, :], (q << 13)[:, None] + 1, 0), axis=0)
        tl.store(mass + at, packed >> 13, mask=live)
        tl.store(ranks + at, packed & 8191, mask=live)

    @triton.jit
    def _count(logits, stride, V, temperature, top_k, top_p, min_p, seed, position, tokens,
               frontier, state, mass, ranks, totals, arrivals,
               S: tl.constexpr, S_PAD: tl.constexpr, C: tl.constexpr, GF: tl.constexpr,
               GB: tl.constexpr, ACCURATE: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
        tl.static_assert(C <= 4096)  # NOTE: 13 bits of count under the mass in one int64 sum
        r = tl.program_id(0)
        c = tl.program_id(1)
        T = tl.load(temperature + r)
        k = tl.load(top_k + r)
        p = tl.load(top_p + r)
        mp = tl.load(min_p + r)
        # NOTE: only rows with a filter can wait for a count: the others' chunks are not read
        filtered = (T > 0) & (((k > 0) & (k < V)) | (p < 1.0) | (mp > 0.0))
        _, _, z, zkey = _chunk(logits, r, stride, c, tl.where(filtered, V, 0), C)
        if PDL:
            tl.extra.cuda.gdc_wait()  # NOTE: everything below reads what _scan wrote
        gs = tl.arange(0, GB)
        # NOTE: one round trip: a row's state and its first 2 * GB records (stale past G, masked)
        todo = tl.load(state + r * 3)
        G = tl.load(state + r * 3 + 1).to(tl.int32)
        top = tl.load(state + r * 3 + 2)
        f0 = tl.load(frontier + r * GF + gs)
        f1 = tl.load(frontier + r * GF + GB + gs, mask=GB + gs < GF, other=MIN64)
        if todo == COUNT:
            m = _value(top)
            q = _mass(z, m, T, ACCURATE)
            tl.store(totals + r * S + c, tl.sum(q))
            out = (r * S + c) * GF
            _tally(zkey, q, f0, gs < G, mass, ranks, out + gs)
            if G > GB:
                _tally(zkey, q, f1, GB + gs < G, mass, ranks, out + GB + gs)
            for b in range(2, tl.cdiv(G, GB)):  # NOTE: rare: more than 2 * GB records
                at = b * GB + gs
                more = tl.load(frontier + r * GF + at, mask=at < G, other=MIN64)
                _tally(zkey, q, more, at < G, mass, ranks, out + at)
            tl.debug_barrier()
            if tl.atomic_add(arrivals + 2 * r + 1, 1) == S - 1:
                tl.store(arrivals + 2 * r + 1, 0)
                _decide(logits, r, stride, V, T, k, p, mp, G, m, seed, position, tokens, frontier, mass,
                        ranks, totals, S, S_PAD, C, GF, ACCURATE)  # fmt: skip

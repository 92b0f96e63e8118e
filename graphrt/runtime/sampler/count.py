"""The fused sampler's second launch, ``_count``: what ranks before each of a row's records.

For rows :mod:`graphrt.runtime.sampler.kernel`'s ``_scan`` left waiting (state COUNT: top-k /
top-p rows whose score-best token is not rank 0), each program of the grid ``(rows, chunks)``
counts, for every record of its row at once, the tokens of its chunk ranked before it and their
mass (a ``[chunk, GB]`` comparison summed over the chunk: ``GB - 1`` records in the first pass,
its last column the chunk's whole mass; ``GB`` a pass after that; a row has few), and adds them
to the row's sums (integer atomics, so the order of the chunks does not matter: exact). The
row's last program to arrive reads the sums and writes the lowest kept record (:func:`_decide`,
``GD`` records a round trip), or walks on past the last record known (:func:`_walk`); it zeroes
the sums for the next launch.

A program loads its row's parameters and (rows with a filter: only they can wait for a count)
its chunk of logits before it waits for ``_scan`` (with PDL, while ``_scan`` still runs): they
are ``_scan``'s input, not its output.
"""

from __future__ import annotations

from graphrt.kernels.switches import tl, triton

if triton is not None:
    from graphrt.runtime.sampler.kernel import (
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
                S: tl.constexpr, C: tl.constexpr, GF: tl.constexpr, GD: tl.constexpr,
                ACCURATE: tl.constexpr):  # fmt: skip
        """Row ``r``'s token: its lowest kept record (or :func:`_walk` past the last one known).

        Reads the row's sums ``GD`` records at a time, in order, until one is kept (a row has a
        few), then zeroes the sums it used for the next launch."""
        gs = tl.arange(0, GD)
        total = tl.load(totals + r, cache_modifier=".cg")
        k = tl.where((k > 0) & (k < V), k, V)
        limit = tl.where(p < 1.0, p.to(tl.float64) * total.to(tl.float64), float("inf"))
        L = _log_min_p(mp, ACCURATE)
        answer = tl.full([], -1, tl.int64)
        start = 0
        while (answer < 0) & (start < G):
            at = r * GF + start + gs
            live = start + gs < G
            before = tl.load(mass + at, mask=live, other=0, cache_modifier=".cg")
            rank = tl.load(ranks + at, mask=live, other=0, cache_modifier=".cg")
            fz = tl.load(frontier + at, mask=live, other=MIN64)
            keep = _kept(rank, before, tl.math.div_rn(_value(fz) - m, T), k, limit, L) & live
            first = tl.min(tl.where(keep, gs, GD))
            answer = tl.max(tl.where(gs == first, _token(fz), -1))
            start += GD
        if answer < 0:  # NOTE: none of the known records is kept: the row's records were cut short
            last = tl.load(frontier + r * GF + tl.maximum(G - 1, 0))
            cur = tl.where(G > 0, last, MIN64)
            key = _row_key(tl.load(seed + r), tl.load(position + r))
            answer = _walk(logits, r, stride, V, T, key, cur, m, k, limit, L, S, C, ACCURATE)
        tl.store(tokens + r, answer)
        every = tl.arange(0, GF)
        tl.store(mass + r * GF + every, 0, mask=every < G)
        tl.store(ranks + r * GF + every, 0, mask=every < G)
        tl.store(totals + r, 0)

    @triton.jit
    def _tally(zkey, q, f, live, mass, ranks, at):
        """Add, for each record ``f`` [GB] (``live`` ones), the chunk's mass and count ranked before
        it to the row's sums at ``at`` (integer atomics: exact in any order); return the masses
        (a ``MIN64`` record's is the chunk's whole mass)."""
        packed = tl.sum(tl.where(zkey[:, None] > f[None, :], (q << 13)[:, None] + 1, 0), axis=0)
        tl.atomic_add(mass + at, packed >> 13, mask=live, sem="relaxed")
        tl.atomic_add(ranks + at, packed & 8191, mask=live, sem="relaxed")
        return packed >> 13

    @triton.jit
    def _count(logits, stride, V, temperature, top_k, top_p, min_p, seed, position, tokens,
               frontier, state, mass, ranks, totals, arrivals,
               S: tl.constexpr, S_PAD: tl.constexpr, C: tl.constexpr, GF: tl.constexpr,
               GB: tl.constexpr, GD: tl.constexpr, ACCURATE: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
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
        # NOTE: one round trip: a row's state and its first GB - 1 records (stale past G, masked);
        # the last column is MIN64, ranked after every token: its tally is the chunk's whole mass
        todo = tl.load(state + r * 3)
        G = tl.load(state + r * 3 + 1).to(tl.int32)
        top = tl.load(state + r * 3 + 2)
        f = tl.load(frontier + r * GF + gs, mask=gs < GB - 1, other=MIN64)
        if todo == COUNT:
            m = _value(top)
            q = _mass(z, m, T, ACCURATE)
            whole = _tally(zkey, q, f, gs < tl.minimum(G, GB - 1), mass, ranks, r * GF + gs)
            tl.atomic_add(totals + r, tl.sum(tl.where(gs == GB - 1, whole, 0)), sem="relaxed")
            for start in range(GB - 1, G, GB):  # NOTE: rare: more than GB - 1 records
                at = start + gs
                more = tl.load(frontier + r * GF + at, mask=at < G, other=MIN64)
                _tally(zkey, q, more, at < G, mass, ranks, r * GF + at)
            tl.debug_barrier()
            if tl.atomic_add(arrivals + 2 * r + 1, 1) == S - 1:
                tl.store(arrivals + 2 * r + 1, 0)
                _decide(logits, r, stride, V, T, k, p, mp, G, m, seed, position, tokens, frontier, mass,
                        ranks, totals, S, C, GF, GD, ACCURATE)  # fmt: skip

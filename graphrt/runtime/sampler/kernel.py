"""The fused sampler's two Triton kernels: :mod:`graphrt.runtime.sampler.draw`'s draw, sorting nothing.

A row's tokens have two orders: **rank** (logit descending, then id ascending; an int64 *rank
key* ``zkey``, larger = ranked first) and **score** (Gumbel score ``z / T + g`` descending, then
id ascending; ``skey``). Every filter keeps a rank prefix, and the draw is the score-best token
of the kept prefix. The score-best token of any prefix is a *record*: a token that beats every
token ranked before it. Walking up from the row's score-best token (each record the score-best
token ranked before the last) reaches rank 0 after a few records (~ln V for equal logits, fewer
for real ones), and the draw is the lowest record that is kept. So a row needs its records and,
for top-k / top-p, each record's rank and the mass ranked before it: never a sort.

The vocabulary is cut into chunks of ``C`` entries, one program each; both launches use the grid
``(rows, chunks)`` (a function of the graph key). The last program of a row to arrive (an
atomic counter, which it resets to 0 for the next launch) finishes the row.

- ``_scan``: each program writes its chunk's rank maximum and (sampled rows) its records, at most
  ``PF``. The row's last program merges the chunks' records into the row's records (at most
  ``GF``) and writes the token of greedy rows, of rows without filters and of min-p-only rows.
- ``_count`` (top-k / top-p rows, :mod:`graphrt.runtime.sampler.count`): each program counts, per
  row record, its tokens ranked before it and their mass. The row's last program adds them up
  and writes the lowest kept record.

Every step up a record chain (in a chunk, and in the merge) is one pairwise reduction of
(score key, rank key) (:func:`_step`), not a maximum and then a search for its rank key; the
merge reads its chunks' counts and records in one round trip; a row whose score-best token is
its rank 0 is done in ``_scan`` whatever its filters (rank 0 is always kept), and ``_count``
counts all of a row's records in one pass over its chunk (see there).

Records are counted, never assumed few: a chunk with more than ``PF`` (for equal logits, the
worst case since the noise does not depend on them, probability ~1e-11 per chunk of 4096 at
``PF`` 32), or a row with more than ``GF``, keeps its lowest ones; the merge stops where a
cut-short chunk's records end (above that a step could skip a record), and if none of the known
records is kept the row's last ``_count`` program walks on to rank 0 itself, two passes over
the row per record: slow, still exact (``tests/runtime/test_sampler_kernel.py`` forces it).
"""

from __future__ import annotations

from graphrt.kernels.switches import tl, triton

if triton is not None:
    from triton.language.extra import libdevice

    MIN64 = tl.constexpr(-(2**63))
    MAX64 = tl.constexpr(2**63 - 1)
    #: ``state[r, 0]``: the row is done (token written) or waits for ``_count``; ``state[r, 1]``:
    #: its records in ``frontier``; ``state[r, 2]``: its largest rank key.
    DONE = tl.constexpr(0)
    COUNT = tl.constexpr(1)

    @triton.jit
    def _log(x, ACCURATE: tl.constexpr):
        if ACCURATE:  # NOTE: CUDA's logf, as torch's CUDA kernels call (tl.log may approximate)
            return libdevice.log(x)
        else:
            return tl.log(x)

    @triton.jit
    def _exp(x, ACCURATE: tl.constexpr):
        if ACCURATE:
            return libdevice.exp(x)
        else:
            return tl.exp(x)

    @triton.jit
    def _log_min_p(mp, ACCURATE: tl.constexpr):
        """``log(min_p)``, -inf for 0 (without asking for log(0))."""
        return tl.where(mp > 0.0, _log(tl.where(mp > 0.0, mp, 1.0), ACCURATE), float("-inf"))

    @triton.jit
    def _pack(x, ids):
        """int64 key: ``x``'s float order in the high half, ``~id`` below (ties: lower id wins)."""
        b = x.to(tl.int32, bitcast=True)
        b = b ^ ((b >> 31) & 0x7FFFFFFF)
        return (b.to(tl.int64) << 32) | (0xFFFFFFFF - ids.to(tl.int64))

    @triton.jit
    def _value(key):
        """The float32 a :func:`_pack` key holds."""
        b = (key >> 32).to(tl.int32)
        return (b ^ ((b >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)

    @triton.jit
    def _token(key):
        return 0xFFFFFFFF - (key & 0xFFFFFFFF)

    @triton.jit
    def _mix32(x):
        """``sampler.mix32`` on uint32 (products wrap mod 2**32, as there)."""
        x = x ^ (x >> 16)
        x = x * 0x21F0AAAD
        x = x ^ (x >> 15)
        x = x * 0x735A2D97
        return x ^ (x >> 15)

    @triton.jit
    def _row_key(seed, position):
        key = _mix32(_mix32(((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)) ^ (seed & 0xFFFFFFFF).to(tl.uint32))
        return _mix32(key ^ (position & 0xFFFFFFFF).to(tl.uint32))

    @triton.jit
    def _chunk(logits, r, stride, c, V, C: tl.constexpr):
        """Chunk ``c`` of row ``r``: ids, in-vocabulary mask, float32 logits (-0.0 made 0.0), zkey."""
        ids = c * C + tl.arange(0, C)
        inb = ids < V
        z = tl.load(logits + r.to(tl.int64) * stride + ids, mask=inb, other=float("-inf")).to(tl.float32)
        z = tl.where(z == 0.0, 0.0, z)
        return ids, inb, z, tl.where(inb, _pack(z, ids), MIN64)

    @triton.jit
    def _scores(z, ids, inb, T, key, ACCURATE: tl.constexpr):
        """skey of ``z / T + g``, ``g = -log(-log(u))`` from the hash of (row key, id) (``uniforms``)."""
        bits = _mix32(_mix32(key ^ ids.to(tl.uint32)) ^ 0x9E3779B9)
        u = ((bits >> 8).to(tl.float32) + 0.5) * 5.9604644775390625e-08  # 2**-24
        s = tl.math.div_rn(z, T) + -_log(-_log(u, ACCURATE), ACCURATE)
        return tl.where(inb, _pack(tl.where(s == 0.0, 0.0, s), ids), MIN64)

    @triton.jit
    def _mass(z, m, T, ACCURATE: tl.constexpr):
        """``floor(exp((z - m) / T) * 2**32)`` int64 (0 for -inf logits)."""
        return tl.floor(_exp(tl.math.div_rn(z - m, T), ACCURATE) * 4294967296.0).to(tl.int64)

    @triton.jit
    def _kept(rank, before, d, k, limit, L):
        """The three filters of ``sampler.keep_mask`` (``k`` V and ``limit`` inf when off)."""
        return (rank < k) & (before.to(tl.float64) < limit) & (d >= L)

    @triton.jit
    def _better(s1, z1, s2, z2):
        """Combine of :func:`_step`: the (score key, rank key) pair with the larger score key."""
        take = s1 > s2
        return tl.where(take, s1, s2), tl.where(take, z1, z2)

    @triton.jit
    def _step(skey, zkey, cur):
        """(skey, zkey) of the score-best entry ranked before ``cur``; skey MIN64 if there is none."""
        return tl.reduce((tl.where(zkey > cur, skey, MIN64), zkey), 0, _better)

    @triton.jit
    def _records(zkey, skey, out, limit):
        """Store up to ``limit`` records (zkey, skey) from the score-best up; (count, all found)."""
        n = 0
        best, cur = _step(skey, zkey, MIN64)
        while (n < limit) & (best != MIN64):
            tl.store(out + 2 * n, cur)
            tl.store(out + 2 * n + 1, best)
            n += 1
            best, cur = _step(skey, zkey, cur)
        return n, best == MIN64

    @triton.jit
    def _merge(r, V, T, k, p, mp, tokens, records, counts, frontier, state, tops, S, S_PAD, PF, GF, ACCURATE):
        """Row ``r``'s records from its chunks'; the token if no count is needed, else COUNT."""
        i = tl.arange(0, S_PAD * PF)
        c, t = i // PF, i % PF
        at = ((r * S + c) * PF + t) * 2
        # NOTE: one round trip: slots past a chunk's count hold stale keys, masked once n is in
        n = tl.load(counts + r * S + c, mask=c < S, other=0, cache_modifier=".cg")
        rz = tl.load(records + at, mask=c < S, other=MIN64, cache_modifier=".cg")
        rs = tl.load(records + at + 1, mask=c < S, other=MIN64, cache_modifier=".cg")
        top = tl.max(tops)
        live = (c < S) & (t < (n & 255))
        rz = tl.where(live, rz, MIN64)
        rs = tl.where(live, rs, MIN64)
        # NOTE: a step up from cur is exact while every chunk cut short has a record ranked before cur.
        bound = tl.min(tl.where(live & (t == (n & 255) - 1) & ((n >> 8) == 0), rz, MAX64))
        counted = ((k > 0) & (k < V)) | (p < 1.0)
        L = _log_min_p(mp, ACCURATE)
        m = _value(top)
        g = 0
        prev = tl.full([], MIN64, tl.int64)
        answer = tl.full([], -1, tl.int64)
        best, cur = _step(rs, rz, prev)
        while (g < GF) & (best != MIN64) & (prev < bound) & (answer < 0):
            tl.store(frontier + r * GF + g, cur)
            # NOTE: rank 0 is always kept: a row whose score-best token is rank 0 needs no count
            ok = ((~counted) & (tl.math.div_rn(_value(cur) - m, T) >= L)) | ((g == 0) & (cur == top))
            answer = tl.where(ok, _token(cur), answer)
            g += 1
            prev = cur
            best, cur = _step(rs, rz, cur)
        if answer >= 0:
            tl.store(tokens + r, answer)
            tl.store(state + r * 3, DONE)
        else:
            tl.store(state + r * 3, COUNT)
            tl.store(state + r * 3 + 1, g)
            tl.store(state + r * 3 + 2, top)

    @triton.jit
    def _scan(logits, stride, V, temperature, top_k, top_p, min_p, seed, position, tokens,
              tops, records, counts, frontier, state, arrivals,
              S: tl.constexpr, S_PAD: tl.constexpr, C: tl.constexpr, PF: tl.constexpr,
              GF: tl.constexpr, ACCURATE: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
        tl.static_assert(PF < 256)
        if PDL:  # NOTE: _count may launch now; its programs wait for this whole grid to finish
            tl.extra.cuda.gdc_launch_dependents()
        r = tl.program_id(0)
        c = tl.program_id(1)
        ids, inb, z, zkey = _chunk(logits, r, stride, c, V, C)
        tl.store(tops + r * S + c, tl.max(zkey))
        T = tl.load(temperature + r)
        k = tl.load(top_k + r)
        p = tl.load(top_p + r)
        mp = tl.load(min_p + r)
        if T > 0:
            skey = _scores(z, ids, inb, T, _row_key(tl.load(seed + r), tl.load(position + r)), ACCURATE)
            limit = tl.where(((k > 0) & (k < V)) | (p < 1.0) | (mp > 0.0), PF, 1)
            n, complete = _records(zkey, skey, records + (r * S + c) * PF * 2, limit)
            tl.store(counts + r * S + c, n + complete.to(tl.int32) * 256)
        tl.debug_barrier()  # NOTE: every thread's stores before the one atomic (release)
        if tl.atomic_add(arrivals + 2 * r, 1) == S - 1:
            tl.store(arrivals + 2 * r, 0)
            cs = tl.arange(0, S_PAD)
            tz = tl.load(tops + r * S + cs, mask=cs < S, other=MIN64, cache_modifier=".cg")
            if T > 0:
                _merge(r, V, T, k, p, mp, tokens, records, counts, frontier, state, tz,
                       S, S_PAD, PF, GF, ACCURATE)  # fmt: skip
            else:
                tl.store(tokens + r, _token(tl.max(tz)))
                tl.store(state + r * 3, DONE)

"""The fused sampler's kernels as they were before the pairwise reductions (commit 3ad0d17), kept to
time against (``graphrt bench sampler``'s ``fused_v1`` path): the same draws, a serial merge and
count. Launched by :func:`graphrt.runtime.sampler_launch.fused_sample` with ``kernels=KERNELS``.
The current kernels' module (:mod:`graphrt.runtime.sampler_kernel`) explains the method.
"""

from __future__ import annotations

from graphrt.runtime.sampler_launch import Kernels
from graphrt.step.switches import tl, triton

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
    def _records(zkey, skey, out, limit):
        """Store up to ``limit`` records (zkey, skey) from the score-best up; (count, all found)."""
        n = 0
        cur = tl.full([], MIN64, tl.int64)
        best = tl.max(tl.where(zkey > cur, skey, MIN64))
        while (n < limit) & (best != MIN64):
            cur = tl.max(tl.where(skey == best, zkey, MIN64))
            tl.store(out + 2 * n, cur)
            tl.store(out + 2 * n + 1, best)
            n += 1
            best = tl.max(tl.where(zkey > cur, skey, MIN64))
        return n, best == MIN64

    @triton.jit
    def _merge(r, V, T, k, p, mp, tokens, records, counts, frontier, state, top, S, S_PAD, PF, GF, ACCURATE):
        """Row ``r``'s records from its chunks'; the token if no count is needed, else COUNT."""
        i = tl.arange(0, S_PAD * PF)
        c, t = i // PF, i % PF
        n = tl.load(counts + r * S + c, mask=c < S, other=0, cache_modifier=".cg")
        live = (c < S) & (t < (n & 255))
        rz = tl.load(records + ((r * S + c) * PF + t) * 2, mask=live, other=MIN64, cache_modifier=".cg")
        rs = tl.load(records + ((r * S + c) * PF + t) * 2 + 1, mask=live, other=MIN64, cache_modifier=".cg")
        # NOTE: a step up from cur is exact while every chunk cut short has a record ranked before cur.
        bound = tl.min(tl.where(live & (t == (n & 255) - 1) & ((n >> 8) == 0), rz, MAX64))
        counted = ((k > 0) & (k < V)) | (p < 1.0)
        L = _log_min_p(mp, ACCURATE)
        m = _value(top)
        g = 0
        cur = tl.full([], MIN64, tl.int64)
        answer = tl.full([], -1, tl.int64)
        best = tl.max(tl.where(rz > cur, rs, MIN64))
        while (g < GF) & (best != MIN64) & (cur < bound) & (answer < 0):
            cur = tl.max(tl.where(rs == best, rz, MIN64))
            tl.store(frontier + r * GF + g, cur)
            ok = (~counted) & (tl.math.div_rn(_value(cur) - m, T) >= L)
            answer = tl.where(ok, _token(cur), answer)
            g += 1
            best = tl.max(tl.where(rz > cur, rs, MIN64))
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
            top = tl.max(tl.load(tops + r * S + cs, mask=cs < S, other=MIN64, cache_modifier=".cg"))
            if T > 0:
                _merge(r, V, T, k, p, mp, tokens, records, counts, frontier, state, top,
                       S, S_PAD, PF, GF, ACCURATE)  # fmt: skip
            else:
                tl.store(tokens + r, _token(top))
                tl.store(state + r * 3, DONE)

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
    def _decide(logits, r, stride, V, T, k, p, mp, key, tokens, frontier, state, mass, ranks, totals,
                S: tl.constexpr, S_PAD: tl.constexpr, C: tl.constexpr, GF: tl.constexpr,
                ACCURATE: tl.constexpr):  # fmt: skip
        """Row ``r``'s token: its lowest kept record (or :func:`_walk` past the last one known)."""
        G = tl.load(state + r * 3 + 1).to(tl.int32)
        m = _value(tl.load(state + r * 3 + 2))
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
            answer = _walk(logits, r, stride, V, T, key, cur, m, k, limit, L, S, C, ACCURATE)
        tl.store(tokens + r, answer)

    @triton.jit
    def _count(logits, stride, V, temperature, top_k, top_p, min_p, seed, position, tokens,
               frontier, state, mass, ranks, totals, arrivals,
               S: tl.constexpr, S_PAD: tl.constexpr, C: tl.constexpr, GF: tl.constexpr,
               ACCURATE: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
        tl.static_assert(C <= 4096)  # NOTE: 13 bits of count under the mass in one int64 sum
        if PDL:
            tl.extra.cuda.gdc_wait()  # NOTE: everything below reads what _scan wrote
        r = tl.program_id(0)
        c = tl.program_id(1)
        if tl.load(state + r * 3) == COUNT:
            T = tl.load(temperature + r)
            _, _, z, zkey = _chunk(logits, r, stride, c, V, C)
            q = _mass(z, _value(tl.load(state + r * 3 + 2)), T, ACCURATE)
            tl.store(totals + r * S + c, tl.sum(q))
            out = (r * S + c) * GF
            for g in range(0, tl.load(state + r * 3 + 1).to(tl.int32)):
                f = tl.load(frontier + r * GF + g)
                packed = tl.sum(tl.where(zkey > f, (q << 13) + 1, 0))
                tl.store(mass + out + g, packed >> 13)
                tl.store(ranks + out + g, packed & 8191)
            tl.debug_barrier()
            if tl.atomic_add(arrivals + 2 * r + 1, 1) == S - 1:
                tl.store(arrivals + 2 * r + 1, 0)
                key = _row_key(tl.load(seed + r), tl.load(position + r))
                _decide(logits, r, stride, V, T, tl.load(top_k + r), tl.load(top_p + r), tl.load(min_p + r),
                        key, tokens, frontier, state, mass, ranks, totals, S, S_PAD, C, GF, ACCURATE)  # fmt: skip

    #: The pair, for ``fused_sample(..., kernels=KERNELS)`` (its ``_count`` takes no extra constexpr).
    KERNELS = Kernels(_scan, _count, ())

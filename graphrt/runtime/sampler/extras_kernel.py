"""The sampler's extras as two Triton kernels: ``_before`` the draw and ``_after`` it.

Both compute what the torch code of :mod:`graphrt.runtime.sampler.extras` computes (token masks,
penalties, counts, log-probabilities), for every row at once and with fixed shapes.

- ``_before`` (grid ``(rows, chunks)``, ``C`` vocabulary entries a program) loads its chunk of the
  raw logits once. With ``WRITE`` it stores the chunk of ``z``: the logits in float32 with the
  row's token mask (``-inf`` where a bit is clear) and penalties applied, each float step the
  same IEEE operation as the torch code's (``div_rn``, no fused multiply-add), so ``z`` is equal
  bit for bit. With ``K > 0`` it also stores the chunk's part of the raw logits' log-softmax: its
  maximum, its ``sum(exp(x - max))`` and its ``K`` best tokens as int64 keys (value order high,
  lower id first on ties).
- ``_after`` (grid ``(rows,)``) adds each row's drawn token to its counts (an atomic add: pad rows
  share the dummy row) and, with ``K > 0``, merges the chunks' parts into the row's packed
  log-probabilities ``[1 + 2K]``: the drawn token's, the ``K`` best (descending), their ids.
"""

from __future__ import annotations

from graphrt.kernels.switches import tl, triton

if triton is not None:
    from graphrt.runtime.sampler.kernel import MIN64, _exp, _log, _pack, _token, _value

    @triton.jit
    def _penalised(z, ids, inb, req, counts, prompt, rep, freq, pres, V):
        """``z`` with the row's repetition, frequency and presence penalties (vLLM's order)."""
        cnt = tl.load(counts + req * V + ids, mask=inb, other=0)
        marked = tl.load(prompt + req * V + ids, mask=inb, other=0) != 0
        seen = (cnt > 0) | marked
        z = tl.where(seen, tl.where(z > 0.0, tl.math.div_rn(z, rep), z * rep), z)
        z = z - freq * cnt.to(tl.float32)
        return z - pres * (cnt > 0).to(tl.float32)

    @triton.jit
    def _before(logits, stride, V, rows, masks, words, counts, prompt, rep, freq, pres, z_out,
                part_max, part_sum, part_keys,
                S: tl.constexpr, C: tl.constexpr, K: tl.constexpr, MASKS: tl.constexpr,
                PENALTIES: tl.constexpr, ACCURATE: tl.constexpr):  # fmt: skip
        r = tl.program_id(0)
        c = tl.program_id(1)
        ids = c * C + tl.arange(0, C)
        inb = ids < V
        x = tl.load(logits + r.to(tl.int64) * stride + ids, mask=inb, other=float("-inf")).to(tl.float32)
        if K > 0:
            m = tl.max(x)
            tl.store(part_max + r * S + c, m)
            tl.store(part_sum + r * S + c, tl.sum(tl.where(inb, _exp(x - m, ACCURATE), 0.0)))
            key = tl.where(inb, _pack(tl.where(x == 0.0, 0.0, x), ids), MIN64)
            out = part_keys + (r * S + c) * K
            for i in tl.static_range(K):
                best = tl.max(key)
                tl.store(out + i, best)
                key = tl.where(key == best, MIN64, key)
        if MASKS or PENALTIES:
            req = tl.load(rows + r).to(tl.int64)
            z = x
            if MASKS:
                w = tl.load(masks + req * words + ids // 32, mask=inb, other=-1)
                z = tl.where(((w >> (ids % 32)) & 1) != 0, z, float("-inf"))
            if PENALTIES:
                p = (tl.load(rep + r), tl.load(freq + r), tl.load(pres + r))
                z = _penalised(z, ids, inb, req, counts, prompt, p[0], p[1], p[2], V)
            tl.store(z_out + r.to(tl.int64) * V + ids, z, mask=inb)

    @triton.jit
    def _after(logits, stride, V, rows, tokens, counts, part_max, part_sum, part_keys, out,
               S: tl.constexpr, S_PAD: tl.constexpr, K: tl.constexpr, KS_PAD: tl.constexpr,
               COUNT: tl.constexpr, ACCURATE: tl.constexpr):  # fmt: skip
        r = tl.program_id(0)
        token = tl.load(tokens + r)
        if COUNT:
            tl.atomic_add(counts + tl.load(rows + r).to(tl.int64) * V + token, 1)
        if K > 0:
            cs = tl.arange(0, S_PAD)
            m = tl.load(part_max + r * S + cs, mask=cs < S, other=float("-inf"))
            top = tl.max(m)
            s = tl.load(part_sum + r * S + cs, mask=cs < S, other=0.0)
            lse = top + _log(tl.sum(tl.where(cs < S, s * _exp(m - top, ACCURATE), 0.0)), ACCURATE)
            row = out + r * (1 + 2 * K)
            tl.store(row, tl.load(logits + r.to(tl.int64) * stride + token).to(tl.float32) - lse)
            i = tl.arange(0, KS_PAD)
            key = tl.load(part_keys + r * S * K + i, mask=i < S * K, other=MIN64)
            for j in tl.static_range(K):
                best = tl.max(key)
                tl.store(row + 1 + j, _value(best) - lse)
                tl.store(row + 1 + K + j, _token(best).to(tl.float32))
                key = tl.where(key == best, MIN64, key)

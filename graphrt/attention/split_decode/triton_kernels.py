"""The Triton kernels of the split decode attention (:mod:`graphrt.attention.split_decode.attend`).

``_decode_split`` program ``(b, h_k, s)``: the ``s``-th share of request ``b``'s visible keys (all
of them, or with ``WINDOW`` the last ``window + 1``) for the ``G`` query heads of KV head ``h_k``
(with ``CHAIN`` > 1, row ``b`` is query token ``b % CHAIN`` of request ``b // CHAIN``'s chain, seeing
its request's keys up to its own position: a verify chain, one single-token row per token);
with ``SINKS`` each head's sink logit joins the merged denominator. Only the ``n`` splits whose shares hold keys store a state
(:func:`_shares`), and the last of those ``n`` programs of a (request, KV head) to count itself
merges its ``G`` heads (:func:`_merge_last`): one launch, no merge kernel. With ``ROPE`` the
launch does ``rope_store``'s work too: every program rotates its ``G`` query heads as it loads
them (:func:`_query`), and the program whose share holds the request's newest key (program 0
without keys) rotates the new key of its KV head and stores it and the value at ``loc[b]``
(:func:`_store_new`) before its key loop, which reads them back after a barrier; no other
program reads that position.
"""

from __future__ import annotations

from graphrt.kernels.switches import tl, triton

if triton is not None:
    from graphrt.kv.rope_store import rotate_halves, rotate_heads

    @triton.jit
    def _dot(a, b, F32_DOT: tl.constexpr):
        """``a @ b`` in fp32. NOTE: Triton's interpreter multiplies bf16 as raw uint16 bits."""
        if F32_DOT:
            return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
        return tl.dot(a, b)

    @triton.jit
    def _angles(cos_sin, loc, b64, cs_sb, loc_sb, D: tl.constexpr, ROPE: tl.constexpr):
        """Request ``b``'s RoPE angles (float32 of the model-dtype ``cos_sin`` row) as halves
        ``[D // 2]`` and as whole heads ``[1, D]`` (each half's angles twice), and its new slot
        ``loc[b]``; without ``ROPE`` zeros, never read."""
        rh, rd = tl.arange(0, D // 2), tl.arange(0, D)[None, :]
        if ROPE:
            row = cos_sin + b64 * cs_sb
            cos = tl.load(row + rh).to(tl.float32)
            sin = tl.load(row + D // 2 + rh).to(tl.float32)
            cos_d = tl.load(row + rd % (D // 2)).to(tl.float32)
            sin_d = tl.load(row + D // 2 + rd % (D // 2)).to(tl.float32)
            slot = tl.load(loc + b64 * loc_sb).to(tl.int64)
        else:
            cos, cos_d = tl.zeros((D // 2,), dtype=tl.float32), tl.zeros((1, D), dtype=tl.float32)
            sin, sin_d, slot = cos, cos_d, b64 * 0
        return cos, sin, cos_d, sin_d, slot

    @triton.jit
    def _query(q_rows, rd, mask, cos_d, sin_d, D: tl.constexpr, ROPE: tl.constexpr):
        """The query heads at ``q_rows [BLOCK_G, 1]`` (``rd``: ``arange(D)[None, :]``) in their
        dtype; with ``ROPE`` rotated first: each element with its partner of the other half by
        :func:`rotate_halves`'s own expressions (lower ``x1 cos - x2 sin``, upper ``x2 cos + x1
        sin``) in float32, rounded once, as ``rope_store`` rotates q. NOTE: whole heads (q loaded
        again at its partners' offsets), so the key loop stays one dot over ``D`` as without
        RoPE: no two half dots, no join of halves in registers."""
        x = tl.load(q_rows + rd, mask=mask, other=0.0)
        if ROPE:
            xf = x.to(tl.float32)
            xp = tl.load(q_rows + (rd + D // 2) % D, mask=mask, other=0.0).to(tl.float32)
            lo, _ = rotate_halves(xf, xp, cos_d, sin_d)
            _, hi = rotate_halves(xp, xf, cos_d, sin_d)
            x = tl.where(rd < D // 2, lo, hi).to(q_rows.dtype.element_ty)
        return x

    @triton.jit
    def _store_new(
        k_new, v_new, k_cache, v_cache, cos, sin, b64, hk, slot, kn_sb, vn_sb, kc_ss, kc_sh, D: tl.constexpr
    ):  # fmt: skip
        """Request ``b``'s new key of KV head ``hk`` (packed heads at ``k_new + b * kn_sb``)
        rotated and its value, stored at cache slot ``slot``: the key by ``rope_store``'s own
        :func:`rotate_heads`, so the cache holds the bits ``rope_store`` writes."""
        at = slot * kc_ss + hk * kc_sh
        rh, one = tl.arange(0, D // 2), tl.arange(0, 1)
        rotate_heads(
            k_new + b64 * kn_sb + hk * D, k_cache + at, cos, sin, rh, one, 1.0, 1, D // 2, False, 1.0
        )
        rd = tl.arange(0, D)
        tl.store(v_cache + at + rd, tl.load(v_new + b64 * vn_sb + hk * D + rd))

    @triton.jit
    def _shares(span, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr):
        """A row of ``span`` visible keys: the keys of each split's share (whole ``BLOCK_N`` blocks;
        0 without keys) and how many splits store a state for the merge: the ``cdiv(span, per)``
        whose shares hold keys (0 without keys)."""
        per = tl.cdiv(tl.cdiv(span, BLOCK_N), SPLITS) * BLOCK_N
        n = tl.cdiv(span, tl.maximum(per, 1))
        return per, n

    @triton.jit
    def _with_sinks(top, total, o, sinks, G: tl.constexpr, MERGE_G: tl.constexpr):
        """The merged state with each head's sink logit (``sinks [G]``, natural units) joined to
        its denominator only, as a key with no value would be: ``top`` and the sink in log2 units."""
        rg = tl.arange(0, MERGE_G)
        sink = tl.load(sinks + rg, mask=rg < G, other=float("-inf")).to(tl.float32) * 1.4426950408889634
        new = tl.maximum(top, sink)
        safe = tl.where(new > float("-inf"), new, 0.0)
        alpha = tl.exp2(top - safe)
        return total * alpha + tl.exp2(sink - safe), o * alpha[:, None]

    @triton.jit
    def _merged_heads(
        m_in, l_in, acc_in, first, n, sinks, G: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr,
        MERGE_G: tl.constexpr, CHUNK: tl.constexpr, SINKS: tl.constexpr,
    ):  # fmt: skip
        """The first ``n`` split states of ``G`` consecutive query heads (``first``: the state
        index of head 0's split 0) merged, ``[MERGE_G, D]`` fp32: ``CHUNK`` splits of every head
        at a time, weighted by ``exp(m_s - M)`` against the running max ``M`` (earlier chunks
        rescaled when it grows), divided once; zeros without keys. NOTE: m, l and acc load
        together, so up to ``CHUNK`` splits cost one L2 round trip (``.cg``: other programs of
        this launch stored them)."""
        rg, rc, rd = tl.arange(0, MERGE_G), tl.arange(0, CHUNK), tl.arange(0, D)
        rows = first + rg * SPLITS
        top = tl.full((MERGE_G,), float("-inf"), dtype=tl.float32)
        total = tl.zeros((MERGE_G,), dtype=tl.float32)
        o = tl.zeros((MERGE_G, D), dtype=tl.float32)
        for c0 in range(0, n, CHUNK):
            at = rows[:, None] + c0 + rc[None, :]
            ok = (rg[:, None] < G) & (c0 + rc[None, :] < n)
            mc = tl.load(m_in + at, mask=ok, other=float("-inf"), cache_modifier=".cg")
            lc = tl.load(l_in + at, mask=ok, other=0.0, cache_modifier=".cg")
            at3, ok3 = at[:, :, None] * D + rd[None, None, :], ok[:, :, None]
            acc = tl.load(acc_in + at3, mask=ok3, other=0.0, cache_modifier=".cg")
            new = tl.maximum(top, tl.max(mc, axis=1))
            safe = tl.where(new > float("-inf"), new, 0.0)  # NOTE: a head without keys: no inf - inf
            alpha = tl.exp2(top - safe)
            w = tl.where(mc > float("-inf"), tl.exp2(mc - safe[:, None]), 0.0)
            total = total * alpha + tl.sum(lc * w, axis=1)
            o = o * alpha[:, None] + tl.sum(acc * w[:, :, None], axis=1)
            top = new
        if SINKS:
            total, o = _with_sinks(top, total, o, sinks, G, MERGE_G)
        o = o / tl.where(total > 0, total, 1.0)[:, None]
        return tl.where(total[:, None] > 0, o, 0.0)

    @triton.jit
    def _merge_last(
        m_in, l_in, acc_in, out, first, o_row, o_sh, counter, s, n, sinks, G: tl.constexpr,
        D: tl.constexpr, SPLITS: tl.constexpr, MERGE_G: tl.constexpr, CHUNK: tl.constexpr,
        SINKS: tl.constexpr,
    ):  # fmt: skip
        """The last of the ``n`` programs whose shares hold keys to count itself on ``counter``
        (its request and KV head's) merges the ``G`` query heads (:func:`_merged_heads`) into
        ``out + o_row`` and sets the counter back to 0; programs without keys never count, and
        with no keys at all (``n == 0``) program 0 writes the zeros."""
        tl.debug_barrier()  # NOTE: every thread's state stores before the one atomic (release)
        if s < n:  # noqa: SIM108 (a branch: only these programs count)
            last = tl.atomic_add(counter, 1) == n - 1  # NOTE: acq_rel: the others' states are visible
        else:
            last = (n == 0) & (s == 0)
        if last:
            tl.store(counter, 0)
            o = _merged_heads(m_in, l_in, acc_in, first, n, sinks, G, D, SPLITS, MERGE_G, CHUNK, SINKS)
            rg = tl.arange(0, MERGE_G)[:, None]
            rows = out + o_row + rg * o_sh + tl.arange(0, D)[None, :]
            tl.store(rows, o.to(out.dtype.element_ty), mask=rg < G)

    @triton.jit
    def _finish(
        m_out, l_out, acc_out, out, arrivals, m, l_sum, acc, b, hk, s, n, o_row, o_sh, sinks,
        G: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr, MERGE_G: tl.constexpr,
        CHUNK: tl.constexpr, SINKS: tl.constexpr,
    ):  # fmt: skip
        """A split program's end: its state (``m``, ``l_sum`` ``[BLOCK_G]``, ``acc [BLOCK_G, D]``
        of query heads ``hk * G + g``) stored unless its share holds no keys (``s >= n``); then
        :func:`_merge_last` (output row ``o_row``; ``SINKS``: the heads' sinks from ``sinks``)."""
        rg, rd = tl.arange(0, m.shape[0]), tl.arange(0, D)
        heads = hk * G + rg
        state = (b * (G * tl.num_programs(1)) + heads) * SPLITS + s
        keep = rg < tl.where(s < n, G, 0)  # NOTE: a share without keys stores nothing
        tl.store(m_out + state, m, mask=keep)
        tl.store(l_out + state, l_sum, mask=keep)
        tl.store(acc_out + state[:, None] * D + rd[None, :], acc, mask=keep[:, None])
        first = (b * (G * tl.num_programs(1)) + hk * G) * SPLITS  # NOTE: head hk * G's split 0
        counter = arrivals + b * tl.num_programs(1) + hk
        _merge_last(
            m_out, l_out, acc_out, out, first, o_row, o_sh, counter, s, n, sinks + hk * G, G, D, SPLITS,
            MERGE_G, CHUNK, SINKS,
        )  # fmt: skip

    @triton.jit
    def _chain_row(page_table, seqlens, b, pt_sb, CHAIN: tl.constexpr):
        """Row ``b``'s page-table row and keys: query token ``b % CHAIN`` of request ``b // CHAIN``
        (a chain of ``CHAIN`` tokens a request, the last at its newest key) sees the keys up to
        its own position, causally."""
        req = b // CHAIN
        seqlen = tl.load(seqlens + req) - (CHAIN - 1 - b % CHAIN)
        return page_table + req.to(tl.int64) * pt_sb, tl.maximum(seqlen, 0)

    @triton.jit
    def _decode_split(
        q, k_cache, v_cache, page_table, seqlens, m_out, l_out, acc_out, arrivals, out, sinks, k_new, v_new,
        cos_sin, loc, q_sb, q_sh, kc_sp, kc_ss, kc_sh, pt_sb, o_sb, o_sh, kn_sb, vn_sb, cs_sb, loc_sb,
        scale_log2, window, PAGE: tl.constexpr, D: tl.constexpr, G: tl.constexpr, BLOCK_G: tl.constexpr,
        BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, PDL: tl.constexpr, F32_DOT: tl.constexpr,
        MERGE_G: tl.constexpr, CHUNK: tl.constexpr, WINDOW: tl.constexpr, SINKS: tl.constexpr,
        ROPE: tl.constexpr, CHAIN: tl.constexpr,
    ):  # fmt: skip
        b, hk, s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        rg, rd, b64 = tl.arange(0, BLOCK_G), tl.arange(0, D), b.to(tl.int64)
        pt_row, seqlen = _chain_row(page_table, seqlens, b, pt_sb, CHAIN)  # NOTE: written before the layer
        lo = seqlen * 0
        if WINDOW:  # NOTE: the query (the last key) sees keys ``seqlen - 1 - window ..`` only
            lo = tl.maximum(seqlen - 1 - window, 0)
        per, n = _shares(seqlen - lo, BLOCK_N, SPLITS)
        start = lo + s * per
        end = tl.minimum(start + per, seqlen)
        # NOTE: the angles and the slot are written before the layer too
        cos, sin, cos_d, sin_d, slot = _angles(cos_sin, loc, b64, cs_sb, loc_sb, D, ROPE)
        if PDL:
            tl.extra.cuda.gdc_wait()  # NOTE: q and this step's k/v come from the kernel before
            tl.extra.cuda.gdc_launch_dependents()
        heads = hk * G + rg
        q_rows = q + b64 * q_sb + heads[:, None] * q_sh
        qt = _query(q_rows, rd[None, :], rg[:, None] < G, cos_d, sin_d, D, ROPE)
        if ROPE:
            # NOTE: the one program whose share holds the newest key (position seqlen - 1; program 0
            # of a row without keys, as rope_store writes every row) stores it before its loop;
            # no other program reads that position.
            if s == tl.maximum(n, 1) - 1:
                _store_new(
                    k_new, v_new, k_cache, v_cache, cos, sin, b64, hk, slot, kn_sb, vn_sb, kc_ss, kc_sh, D
                )
            tl.debug_barrier()  # NOTE: every thread's stores before any thread's loads below
        m = tl.full((BLOCK_G,), float("-inf"), dtype=tl.float32)
        l_sum = tl.zeros((BLOCK_G,), dtype=tl.float32)
        acc = tl.zeros((BLOCK_G, D), dtype=tl.float32)
        for n0 in range(start, end, BLOCK_N):
            pos = n0 + tl.arange(0, BLOCK_N)
            valid = pos < end
            pages = tl.load(pt_row + pos // PAGE, mask=valid, other=0).to(tl.int64)
            rows = (pages * kc_sp + (pos % PAGE) * kc_ss + hk * kc_sh)[:, None] + rd[None, :]
            kt = tl.load(k_cache + rows, mask=valid[:, None], other=0.0)
            scores = _dot(qt, tl.trans(kt), F32_DOT)
            scores = tl.where(valid[None, :], scores * scale_log2, float("-inf"))  # NOTE: log2 units
            m_new = tl.maximum(m, tl.max(scores, axis=1))
            p = tl.exp2(scores - m_new[:, None])
            alpha = tl.exp2(m - m_new)
            l_sum = l_sum * alpha + tl.sum(p, axis=1)
            vt = tl.load(v_cache + rows, mask=valid[:, None], other=0.0)
            acc = acc * alpha[:, None] + _dot(p.to(vt.dtype), vt, F32_DOT)
            m = m_new
        _finish(
            m_out, l_out, acc_out, out, arrivals, m, l_sum, acc, b, hk, s, n, b64 * o_sb + hk * G * o_sh, o_sh,
            sinks, G, D, SPLITS, MERGE_G, CHUNK, SINKS,
        )  # fmt: skip

"""The Triton kernels of the split decode attention (:mod:`graphrt.attention.split_decode.attend`).

``_decode_split`` program ``(b, h_k, s)``: the ``s``-th share of request ``b``'s keys for the
``G`` query heads of KV head ``h_k``; ``_decode_merge`` program ``(b, h)``: the splits of query
head ``h`` merged. With ``LAST_MERGES`` (the default) there is no merge launch: only the ``n``
splits whose shares hold keys store a state (:func:`_shares`), and the last of those ``n``
programs of a (request, KV head) to count itself merges its ``G`` heads (:func:`_merge_last`).
With ``ROPE`` the split also does :func:`graphrt.kv.rope_store.rope_store`'s work for its heads:
it rotates ``q`` on load and the new token's ``k`` (NeoX halves, fp32 math rounded to the model's
dtype, the same expressions as ``rope_store``'s; the scores are the sum of the two halves' dots),
reads the key and value of the request's own slot ``loc[b]`` from the projection instead of the
cache (so no program reads a slot this launch writes), and the program whose share holds position
``cache_seqlens[b] - 1`` (program 0 when there are no keys) writes them to the cache at
``loc[b]``: one writer per (request, KV head).
"""

from __future__ import annotations

from graphrt.kernels.switches import tl, triton

if triton is not None:
    from graphrt.kv.rope_store import rotate_halves

    @triton.jit
    def _halves(rows, rh, cos, sin, mask):
        """The NeoX rotation of the rows starting at ``rows [R, 1]`` (``rh = arange(HALF)[None, :]``,
        ``cos`` / ``sin`` ``[HALF]``) as its two halves ``[R, HALF]``, rounded to their dtype by
        ``rope_store``'s own expressions. NOTE: kept apart (the scores are two dots, one per
        half), not joined into one ``[R, D]`` tile: ptxas (sm_90) then needs 186 registers a
        thread at head dim 64 instead of 200, and 190 instead of 254 at 128."""
        half = rh.shape[1]
        x1 = tl.load(rows + rh, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(rows + half + rh, mask=mask, other=0.0).to(tl.float32)
        y1, y2 = rotate_halves(x1, x2, cos[None, :], sin[None, :])
        ty = rows.dtype.element_ty
        return y1.to(ty), y2.to(ty)

    @triton.jit
    def _dot(a, b, F32_DOT: tl.constexpr):
        """``a @ b`` in fp32. NOTE: Triton's interpreter multiplies bf16 as raw uint16 bits."""
        if F32_DOT:
            return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
        return tl.dot(a, b)

    @triton.jit
    def _new_kv(
        k_new, v_new, k_cache, v_cache, b64, hk, s, seqlen, per, slot, kn_sb, vn_sb, kc_ss, kc_sh,
        cos, sin, D: tl.constexpr,
    ):  # fmt: skip
        """The new token's rotated key halves and value of KV head ``hk`` (``[1, D / 2]`` twice,
        ``[1, D]``; the cache's dtype), stored at ``slot`` by the one program whose share holds
        the last key."""
        row, rd = tl.zeros((1, 1), dtype=tl.int64), tl.arange(0, D)[None, :]
        rh = tl.arange(0, D // 2)[None, :]
        k1, k2 = _halves(k_new + b64 * kn_sb + hk * D + row, rh, cos, sin, row == 0)
        vn = tl.load(v_new + b64 * vn_sb + hk * D + row + rd)
        ty = k_cache.dtype.element_ty
        k1, k2, vn = k1.to(ty), k2.to(ty), vn.to(v_cache.dtype.element_ty)
        # NOTE: the writer's masks as "index < its width or 0" (the interpreter refuses a scalar & block)
        width = tl.where(s == tl.maximum(seqlen - 1, 0) // tl.maximum(per, 1), D, 0)
        at = slot.to(tl.int64) * kc_ss + hk * kc_sh
        tl.store(k_cache + at + rh, k1, mask=rh < width // 2)
        tl.store(k_cache + at + D // 2 + rh, k2, mask=rh < width // 2)
        tl.store(v_cache + at + rd, vn, mask=rd < width)
        return k1, k2, vn

    @triton.jit
    def _tile(cache, rows, rd, cached, own, new, ROPE: tl.constexpr):
        """Keys or values ``[BLOCK_N, len(rd)]`` at ``rows + rd`` (a head, or half of one); with
        ``ROPE`` the own slot's row from ``new [1, len(rd)]``."""
        t = tl.load(cache + rows[:, None] + rd[None, :], mask=cached[:, None], other=0.0)
        if ROPE:
            t = tl.where(own[:, None], new, t)
        return t

    @triton.jit
    def _rope_scores(
        q1, q2, k_cache, rows, rh, cached, own, k1n, k2n, HALF: tl.constexpr, F32_DOT: tl.constexpr
    ):
        """``q . k`` of each key as the sum of its halves' dots (see :func:`_halves`)."""
        k1 = _tile(k_cache, rows, rh, cached, own, k1n, True)
        k2 = _tile(k_cache + HALF, rows, rh, cached, own, k2n, True)
        return _dot(q1, tl.trans(k1), F32_DOT) + _dot(q2, tl.trans(k2), F32_DOT)

    @triton.jit
    def _shares(seqlen, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, LAST_MERGES: tl.constexpr):
        """A row of ``seqlen`` keys: the keys of each split's share (whole ``BLOCK_N`` blocks; 0
        without keys) and how many splits store a state for the merge: with ``LAST_MERGES`` the
        ``cdiv(seqlen, per)`` whose shares hold keys (0 without keys), else all ``SPLITS`` (the
        merge launch reads them all, no row length)."""
        per = tl.cdiv(tl.cdiv(seqlen, BLOCK_N), SPLITS) * BLOCK_N
        n = tl.cdiv(seqlen, tl.maximum(per, 1)) if LAST_MERGES else seqlen * 0 + SPLITS
        return per, n

    @triton.jit
    def _merged_heads(
        m_in, l_in, acc_in, first, n, G: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr,
        MERGE_G: tl.constexpr, CHUNK: tl.constexpr,
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
        o = o / tl.where(total > 0, total, 1.0)[:, None]
        return tl.where(total[:, None] > 0, o, 0.0)

    @triton.jit
    def _merge_last(
        m_in, l_in, acc_in, out, first, o_row, o_sh, counter, s, n, G: tl.constexpr, D: tl.constexpr,
        SPLITS: tl.constexpr, MERGE_G: tl.constexpr, CHUNK: tl.constexpr,
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
            o = _merged_heads(m_in, l_in, acc_in, first, n, G, D, SPLITS, MERGE_G, CHUNK)
            rg = tl.arange(0, MERGE_G)[:, None]
            rows = out + o_row + rg * o_sh + tl.arange(0, D)[None, :]
            tl.store(rows, o.to(out.dtype.element_ty), mask=rg < G)

    @triton.jit
    def _finish(
        m_out, l_out, acc_out, out, arrivals, m, l_sum, acc, b, hk, s, n, o_row, o_sh, G: tl.constexpr,
        D: tl.constexpr, SPLITS: tl.constexpr, LAST_MERGES: tl.constexpr, MERGE_G: tl.constexpr,
        CHUNK: tl.constexpr,
    ):  # fmt: skip
        """A split program's end: its state (``m``, ``l_sum`` ``[BLOCK_G]``, ``acc [BLOCK_G, D]``
        of query heads ``hk * G + g``) stored unless its share holds no keys (``s >= n``); then,
        with ``LAST_MERGES``, :func:`_merge_last` (output row ``o_row``)."""
        rg, rd = tl.arange(0, m.shape[0]), tl.arange(0, D)
        heads = hk * G + rg
        state = (b * (G * tl.num_programs(1)) + heads) * SPLITS + s
        keep = rg < tl.where(s < n, G, 0)  # NOTE: a share without keys stores nothing (LAST_MERGES)
        tl.store(m_out + state, m, mask=keep)
        tl.store(l_out + state, l_sum, mask=keep)
        tl.store(acc_out + state[:, None] * D + rd[None, :], acc, mask=keep[:, None])
        if LAST_MERGES:
            first = (b * (G * tl.num_programs(1)) + hk * G) * SPLITS  # NOTE: head hk * G's split 0
            counter = arrivals + b * tl.num_programs(1) + hk
            _merge_last(
                m_out, l_out, acc_out, out, first, o_row, o_sh, counter, s, n, G, D, SPLITS, MERGE_G, CHUNK,
            )  # fmt: skip

    @triton.jit
    def _decode_split(
        q, k_cache, v_cache, page_table, seqlens, m_out, l_out, acc_out, k_new, v_new, cos_sin, loc,
        arrivals, out, q_sb, q_sh, kc_sp, kc_ss, kc_sh, pt_sb, kn_sb, vn_sb, cs_sb, loc_sb, o_sb, o_sh,
        scale_log2, PAGE: tl.constexpr, D: tl.constexpr, G: tl.constexpr, BLOCK_G: tl.constexpr,
        BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, PDL: tl.constexpr, ROPE: tl.constexpr,
        F32_DOT: tl.constexpr, LAST_MERGES: tl.constexpr, MERGE_G: tl.constexpr, CHUNK: tl.constexpr,
    ):  # fmt: skip
        b, hk, s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        rg, rd, b64 = tl.arange(0, BLOCK_G), tl.arange(0, D), b.to(tl.int64)
        seqlen = tl.load(seqlens + b)  # NOTE: written before the layer: read ahead of the wait
        per, n = _shares(seqlen, BLOCK_N, SPLITS, LAST_MERGES)
        start = s * per
        end = tl.minimum(start + per, seqlen)
        slot = tl.load(loc + b64 * loc_sb) if ROPE else -1  # NOTE: angles and slot: before the layer too
        rh = tl.arange(0, D // 2)
        cos = tl.load(cos_sin + b64 * cs_sb + rh).to(tl.float32) if ROPE else 0.0
        sin = tl.load(cos_sin + b64 * cs_sb + D // 2 + rh).to(tl.float32) if ROPE else 0.0
        if PDL:
            tl.extra.cuda.gdc_wait()  # NOTE: q and this step's k/v come from the kernel before
            tl.extra.cuda.gdc_launch_dependents()
        heads = hk * G + rg
        q_rows = q + b64 * q_sb + heads[:, None] * q_sh
        vn = 0.0
        if ROPE:
            q1, q2 = _halves(q_rows, rh[None, :], cos, sin, rg[:, None] < G)
            k1n, k2n, vn = _new_kv(
                k_new, v_new, k_cache, v_cache, b64, hk, s, seqlen, per, slot, kn_sb, vn_sb, kc_ss, kc_sh,
                cos, sin, D,
            )  # fmt: skip
        else:
            qt = tl.load(q_rows + rd[None, :], mask=rg[:, None] < G, other=0.0)
        m = tl.full((BLOCK_G,), float("-inf"), dtype=tl.float32)
        l_sum = tl.zeros((BLOCK_G,), dtype=tl.float32)
        acc = tl.zeros((BLOCK_G, D), dtype=tl.float32)
        for n0 in range(start, end, BLOCK_N):
            pos = n0 + tl.arange(0, BLOCK_N)
            valid = pos < end
            pages = tl.load(page_table + b64 * pt_sb + pos // PAGE, mask=valid, other=0).to(tl.int64)
            # NOTE: the request's own slot (pad rows: the shared dummy slot) is never read from the
            # cache, which this launch writes: its key and value come from the projection
            own = valid & (pages * PAGE + pos % PAGE == slot)
            cached = valid & ~own if ROPE else valid
            rows = pages * kc_sp + (pos % PAGE) * kc_ss + hk * kc_sh
            if ROPE:
                scores = _rope_scores(q1, q2, k_cache, rows, rh, cached, own, k1n, k2n, D // 2, F32_DOT)
            else:
                scores = _dot(qt, tl.trans(_tile(k_cache, rows, rd, cached, own, 0.0, ROPE)), F32_DOT)
            scores = tl.where(valid[None, :], scores * scale_log2, float("-inf"))  # NOTE: log2 units
            m_new = tl.maximum(m, tl.max(scores, axis=1))
            p = tl.exp2(scores - m_new[:, None])
            alpha = tl.exp2(m - m_new)
            l_sum = l_sum * alpha + tl.sum(p, axis=1)
            vt = _tile(v_cache, rows, rd, cached, own, vn, ROPE)
            acc = acc * alpha[:, None] + _dot(p.to(vt.dtype), vt, F32_DOT)
            m = m_new
        _finish(
            m_out, l_out, acc_out, out, arrivals, m, l_sum, acc, b, hk, s, n, b64 * o_sb + hk * G * o_sh, o_sh,
            G, D, SPLITS, LAST_MERGES, MERGE_G, CHUNK,
        )  # fmt: skip

    @triton.jit
    def _decode_merge(
        m_in, l_in, acc_in, out, o_sb, o_sh, D: tl.constexpr, SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
        PDL: tl.constexpr,
    ):  # fmt: skip
        b, h = tl.program_id(0), tl.program_id(1)
        rs, rd = tl.arange(0, BLOCK_S), tl.arange(0, D)
        if PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        state = (b * tl.num_programs(1) + h) * SPLITS + rs
        has = rs < SPLITS  # NOTE: a split without keys stored its empty state (-inf, 0, 0)
        m = tl.load(m_in + state, mask=has, other=float("-inf"))
        l_sum = tl.load(l_in + state, mask=has, other=0.0)
        top = tl.max(m, axis=0)
        w = tl.where(m > float("-inf"), tl.exp2(m - top), 0.0)
        acc = tl.load(acc_in + state[:, None] * D + rd[None, :], mask=has[:, None], other=0.0)
        total = tl.sum(l_sum * w, axis=0)
        o = tl.sum(acc * w[:, None], axis=0) / tl.where(total > 0, total, 1.0)
        o = tl.where(total > 0, o, 0.0)
        tl.store(out + b.to(tl.int64) * o_sb + h * o_sh + rd, o.to(out.dtype.element_ty))

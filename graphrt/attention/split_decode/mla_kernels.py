"""The Triton kernel of the split decode for dense MLA (:mod:`graphrt.attention.split_decode.mla_attend`).

``_mla_decode_split`` program ``(b, hb, s)``: the ``s``-th share of request ``b``'s keys for the
``G`` query heads ``hb * G ..`` (MQA: every head reads the one latent KV head). Each key ``j``
scores ``(q_rope . k_rope_j + qv . latent_j) * scale`` (two ``tl.dot``, fp32) and its value is
the latent itself, so the ``[BLOCK_N, D]`` latent tile loaded for the scores is reused for
``p @ latent``. Shares are whole ``SHARE_N``-key granules (:func:`_shares` with the granule as
its block), so a split walks at least ``SHARE_N`` keys: each split's state (``G x D`` fp32) is
what the last program reads back to merge, and a granule's cache bytes outweigh it. The state
store and the last-split merge are the MHA kernel's (:func:`_finish`, with the head block in
place of the KV head): one launch, no merge kernel.
"""

from __future__ import annotations

from graphrt.kernels.switches import tl, triton

if triton is not None:
    from graphrt.attention.split_decode.triton_kernels import _dot, _finish, _shares

    @triton.jit
    def _mla_decode_split(
        q_rope, qv, rope_cache, latent_cache, page_table, seqlens, m_out, l_out, acc_out, arrivals,
        out, qr_sb, qr_sh, qv_sb, qv_sh, rc_sp, rc_ss, lc_sp, lc_ss, pt_sb, o_sb, o_sh, scale_log2,
        PAGE: tl.constexpr, R: tl.constexpr, D: tl.constexpr, G: tl.constexpr, BLOCK_G: tl.constexpr,
        BLOCK_N: tl.constexpr, SHARE_N: tl.constexpr, SPLITS: tl.constexpr, PDL: tl.constexpr,
        F32_DOT: tl.constexpr, MERGE_G: tl.constexpr, CHUNK: tl.constexpr,
    ):  # fmt: skip
        b, hb, s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        rg, rr, rd, b64 = tl.arange(0, BLOCK_G), tl.arange(0, R), tl.arange(0, D), b.to(tl.int64)
        seqlen = tl.load(seqlens + b)  # NOTE: written before the layer: read ahead of the wait
        per, n = _shares(seqlen, SHARE_N, SPLITS)
        start = s * per
        end = tl.minimum(start + per, seqlen)
        if PDL:
            tl.extra.cuda.gdc_wait()  # NOTE: q_rope, qv and this step's cache rows come from before
            tl.extra.cuda.gdc_launch_dependents()
        heads, live = hb * G + rg, rg[:, None] < G
        qr = tl.load(q_rope + b64 * qr_sb + heads[:, None] * qr_sh + rr[None, :], mask=live, other=0.0)
        qn = tl.load(qv + b64 * qv_sb + heads[:, None] * qv_sh + rd[None, :], mask=live, other=0.0)
        m = tl.full((BLOCK_G,), float("-inf"), dtype=tl.float32)
        l_sum = tl.zeros((BLOCK_G,), dtype=tl.float32)
        acc = tl.zeros((BLOCK_G, D), dtype=tl.float32)
        for n0 in range(start, end, BLOCK_N):
            pos = n0 + tl.arange(0, BLOCK_N)
            valid = pos < end
            pages = tl.load(page_table + b64 * pt_sb + pos // PAGE, mask=valid, other=0).to(tl.int64)
            slot = pos % PAGE
            kr = tl.load(
                rope_cache + (pages * rc_sp + slot * rc_ss)[:, None] + rr[None, :],
                mask=valid[:, None],
                other=0.0,
            )
            lat = tl.load(
                latent_cache + (pages * lc_sp + slot * lc_ss)[:, None] + rd[None, :],
                mask=valid[:, None],
                other=0.0,
            )
            scores = _dot(qr, tl.trans(kr), F32_DOT) + _dot(qn, tl.trans(lat), F32_DOT)
            scores = tl.where(valid[None, :], scores * scale_log2, float("-inf"))  # NOTE: log2 units
            m_new = tl.maximum(m, tl.max(scores, axis=1))
            p = tl.exp2(scores - m_new[:, None])
            alpha = tl.exp2(m - m_new)
            l_sum = l_sum * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + _dot(p.to(lat.dtype), lat, F32_DOT)  # NOTE: the latent is the value
            m = m_new
        # NOTE: no sinks (SINKS False): ``out`` stands in for their pointer, never read.
        _finish(
            m_out, l_out, acc_out, out, arrivals, m, l_sum, acc, b, hb, s, n, b64 * o_sb + hb * G * o_sh, o_sh,
            out, G, D, SPLITS, MERGE_G, CHUNK, False,
        )  # fmt: skip

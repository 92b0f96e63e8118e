"""The dense-MLA decoder: the ``tiny-mla`` preset and DeepSeek-V2/V3 checkpoints (dense layers).

Multi-head latent attention as transformers' ``DeepseekV3Attention`` computes it, in the
absorbed form SGLang and vLLM decode with: the cache holds each token's normed latent
``c_kv [kv_lora_rank]`` and its RoPE key ``[qk_rope_head_dim]``; ``kv_b_proj`` splits per head
into ``W_UK [qk_nope_head_dim, kv_lora_rank]`` and ``W_UV [v_head_dim, kv_lora_rank]``, so
``q_nope . (W_UK c) == (q_nope W_UK) . c`` (``qv``) and the value ``W_UV c`` is applied after the
attention sums the latents. Submodules keep transformers' names (``attn.kv_a_proj_with_mqa`` for
``self_attn.kv_a_proj_with_mqa``), so a checkpoint maps onto them one to one.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from graphrt.attention.mla_context import MLAContext
from graphrt.kv import latent_store
from graphrt.kv.rope_store import rotate_ref
from graphrt.models import ops
from graphrt.models.llama import Decoder
from graphrt.models.moe import layer_mlp
from graphrt.models.norm import RMSNorm
from graphrt.models.parallel import SINGLE
from graphrt.models.presets import MLAConfig
from graphrt.models.rope import rope_attention_factor, rope_inv_freq
from graphrt.parallel import TPGroup

#: NOTE: transformers builds ``q_a_layernorm`` / ``kv_a_layernorm`` with RMSNorm's default eps
#: (DeepSeek's reference code too), not the config's ``rms_norm_eps``.
LATENT_NORM_EPS = 1e-6


def rotate_interleaved(x: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """DeepSeek's RoPE on ``x [T, heads, d]``: pairs ``(x0, x1), (x2, x3), …`` rotated by one
    frequency each, returned de-interleaved (even lanes, then odd), as transformers'
    ``apply_rotary_pos_emb_interleave``. q and k share the layout, so their dot products are
    those of the interleaved rotation (DeepSeek-V2's complex form included)."""
    return rotate_ref(torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1), cos_sin)


class LatentAttention(nn.Module):
    """One layer's MLA: projections, RoPE, then ``ctx.mla`` over the latent cache."""

    def __init__(self, cfg: MLAConfig, layer_id: int) -> None:
        super().__init__()
        self.cfg, self.layer_id = cfg, layer_id
        h, c, bias = cfg.num_heads, cfg.kv_lora_rank, cfg.attention_bias
        qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
        if cfg.q_lora_rank is None:
            self.q_proj = ops.Linear(cfg.hidden_size, h * qk, bias=False)
        else:
            self.q_a_proj = ops.Linear(cfg.hidden_size, cfg.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = ops.Linear(cfg.q_lora_rank, h * qk, bias=False)
        self.kv_a_proj_with_mqa = ops.Linear(cfg.hidden_size, c + cfg.qk_rope_head_dim, bias=bias)
        self.kv_a_layernorm = RMSNorm(c, LATENT_NORM_EPS)
        self.kv_b_proj = ops.Linear(c, h * (cfg.qk_nope_head_dim + cfg.v_head_dim), bias=False)
        self.o_proj = ops.Linear(h * cfg.v_head_dim, cfg.hidden_size, bias=bias)
        self.rotate = rotate_interleaved if cfg.rope_interleave else rotate_ref

    #: Whether the decoder block fuses its attention norm into :meth:`norm_projection`'s GEMM
    #: and hands its output to :meth:`forward` as ``q_first`` (the normed row as ``x``).
    fuses_norm: ClassVar[bool] = True

    def norm_projection(self) -> ops.Linear:
        """The first projection of the normed row on q's side: ``q_proj``, or ``q_a_proj`` with a q LoRA."""
        return self.q_proj if self.cfg.q_lora_rank is None else self.q_a_proj

    def query(self, x: torch.Tensor, q_first: torch.Tensor | None = None) -> torch.Tensor:
        """``[T, H, qk_nope_head_dim + qk_rope_head_dim]``; ``q_first``: :meth:`norm_projection`'s
        output of ``x`` when the caller computed it."""
        cfg = self.cfg
        first = self.norm_projection()(x) if q_first is None else q_first
        q = first if cfg.q_lora_rank is None else self.q_b_proj(self.q_a_layernorm(first))
        return q.view(x.shape[0], cfg.num_heads, -1)

    def up_projections(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``W_UK [H, qk_nope_head_dim, kv_lora_rank]`` and ``W_UV [H, v_head_dim, kv_lora_rank]``:
        views of ``kv_b_proj.weight`` (k_nope rows then v rows per head)."""
        cfg = self.cfg
        w = self.kv_b_proj.weight.view(cfg.num_heads, cfg.qk_nope_head_dim + cfg.v_head_dim, cfg.kv_lora_rank)
        return w[:, : cfg.qk_nope_head_dim], w[:, cfg.qk_nope_head_dim :]

    def absorb(self, q: torch.Tensor) -> torch.Tensor:
        """``qv [T, H, kv_lora_rank]``: each head's ``q_nope`` times its ``W_UK``, from ``q [T, H,
        nope + rope]``. One batched GEMM over views of ``q`` and the weight (no copy); a
        ``[T, H, c]`` view of its ``[H, T, c]`` output, which FA3 reads with its strides."""
        w_uk, _ = self.up_projections()
        return torch.bmm(q[..., : self.cfg.qk_nope_head_dim].transpose(0, 1), w_uk).transpose(0, 1)

    def expand(self, out: torch.Tensor) -> torch.Tensor:
        """``[T, H * v_head_dim]``: each head's attention output ``out [T, H, kv_lora_rank]``
        times its ``W_UV``. The GEMM writes through a transposed view of a ``[T, H, v]`` tensor,
        so flattening the heads needs no copy."""
        _, w_uv = self.up_projections()
        tokens = out.shape[0]
        if torch.is_grad_enabled():  # NOTE: autograd refuses out=; steps run under no_grad
            return torch.bmm(out.transpose(0, 1), w_uv.transpose(1, 2)).transpose(0, 1).reshape(tokens, -1)
        flat = out.new_empty(tokens, self.cfg.num_heads, self.cfg.v_head_dim)
        torch.bmm(out.transpose(0, 1), w_uv.transpose(1, 2), out=flat.transpose(0, 1))
        return flat.view(tokens, -1)

    def rope_store(
        self, q: torch.Tensor, kv: torch.Tensor, cos_sin: torch.Tensor, ctx: MLAContext
    ) -> torch.Tensor:
        """Rotate ``q``'s RoPE part and ``kv``'s RoPE key, norm ``kv``'s latent and store both in
        the layer's cache; returns the rotated ``q_rope [T, H, qk_rope_head_dim]``. One Triton
        kernel where :mod:`graphrt.kv.latent_store` takes the tensors, else the torch ops."""
        cfg, norm = self.cfg, self.kv_a_layernorm
        rope_cache, latent_cache, loc = ctx.cache(self.layer_id)
        if latent_store.enabled(q.device) and latent_store.fits(
            q, kv, cos_sin, norm.weight, rope_cache, latent_cache
        ):
            return latent_store.rope_norm_store(
                q, kv, cos_sin, norm.weight, norm.eps, rope_cache, latent_cache, loc, cfg.rope_interleave
            )
        latent, k_rope = kv.split((cfg.kv_lora_rank, cfg.qk_rope_head_dim), dim=-1)
        ctx.store(self.layer_id, self.rotate(k_rope[:, None], cos_sin)[:, 0], norm(latent))
        return self.rotate(q[..., cfg.qk_nope_head_dim :], cos_sin)

    def forward(
        self, x: torch.Tensor, cos_sin: torch.Tensor, ctx: MLAContext, q_first: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``x [T, hidden]``: the normed residual stream; ``q_first``: :meth:`norm_projection`'s
        output of ``x`` (the block's fused norm GEMM), None: computed here."""
        q = self.query(x, q_first)
        q_rope = self.rope_store(q, self.kv_a_proj_with_mqa(x), cos_sin, ctx)
        # NOTE: absorbed form — q_nope . (W_UK c) == (q_nope W_UK) . c: the cache holds only c.
        out = ctx.attend(self.layer_id, q_rope, self.absorb(q), self.cfg.softmax_scale)
        return self.o_proj(self.expand(out))


class MLACausalLM(Decoder):
    """A dense-MLA decoder; ``forward(input_ids [T] int64, positions [T] int64, ctx) -> [T, vocab] fp32``.

    ``ctx`` is an :class:`~graphrt.attention.MLAContext` (the runtime builds one for a
    :class:`~graphrt.kv.LatentKVCache`). One rank only: tensor parallelism is refused.
    """

    #: Each layer's attention (DeepSeek-V3.2's subclass puts its indexed attention here).
    attention_layer: ClassVar[type[LatentAttention]] = LatentAttention

    def __init__(self, cfg: MLAConfig, tp: TPGroup = SINGLE) -> None:
        if tp.size > 1:
            raise ValueError(f"tensor parallelism (tp {tp.size}) is not supported for MLA models")
        attention = type(self).attention_layer
        super().__init__(
            cfg, cfg.qk_rope_head_dim, lambda i: attention(cfg, i), mlp=lambda i: layer_mlp(cfg, i)
        )
        self.tie()
        #: YaRN's attention factor on cos/sin (q and k's rotary dims; the V3.2 indexer's too).
        self.rope_scale = rope_attention_factor(cfg.rope_type, cfg.rope_params)

    def tie(self) -> None:
        """Share the embedding with the LM head when the checkpoint ties them."""
        if self.cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed.weight

    def reset_rope(self, device: torch.device) -> None:
        """(Re)compute ``inv_freq`` (float32, on ``device``) from the config's rope type."""
        cfg = self.cfg
        self.inv_freq = rope_inv_freq(
            cfg.rope_theta, cfg.qk_rope_head_dim, cfg.rope_type, cfg.rope_params
        ).to(device)

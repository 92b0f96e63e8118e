"""The decoder every loaded checkpoint becomes: Llama, Mistral, Qwen2 and Qwen3 in one class.

Architectures differ only in flags of :class:`ModelConfig` (q/k/v bias, q/k RMSNorm, sliding
layers, tied embeddings, RoPE scaling); the skeleton is :class:`Decoder`, so the forward is the
same ``forward(input_ids, positions, ctx)`` as the built-in presets, and tensor parallelism
shards it the same way (the parallel layers of :mod:`graphrt.models.parallel`).
"""

from __future__ import annotations

import torch
from torch import nn

from graphrt.kv.quant import KVScales
from graphrt.models.config import ModelConfig
from graphrt.models.llama import Attention, Decoder, Projected
from graphrt.models.moe import layer_mlp
from graphrt.models.norm import RMSNorm
from graphrt.models.parallel import SINGLE
from graphrt.models.qk_norm_rope import RopeInputs, qk_norm_rope
from graphrt.models.rope import rope_attention_factor, rope_inv_freq
from graphrt.parallel import TPGroup


class CausalLMAttention(Attention):
    """:class:`Attention` with the checkpoint's q/k/v and o biases and per-head q/k RMSNorm.

    With q/k RMSNorm (Qwen3) the norm and RoPE go through :func:`qk_norm_rope` (one fused
    sgl-kernel on GPU when it applies, the torch ops otherwise). With ``tp`` it holds this
    rank's query heads and the KV heads they read (split, or replicated when there are fewer KV
    heads than ranks; :func:`kv_heads`).
    """

    def __init__(self, cfg: ModelConfig, layer_id: int, tp: TPGroup = SINGLE) -> None:
        super().__init__(cfg, layer_id, tp, qkv_bias=cfg.qkv_bias, o_bias=cfg.o_bias, sinks=cfg.sinks)
        if cfg.qk_norm_full and tp.size > 1:
            raise ValueError(
                f"tensor parallelism (tp {tp.size}) is not supported with q/k norms over all heads"
            )
        widths = (self.splits[0], self.splits[1]) if cfg.qk_norm_full else (cfg.head_dim, cfg.head_dim)
        norm = cfg.qk_norm or cfg.qk_norm_full
        self.q_norm = RMSNorm(widths[0], cfg.rms_eps) if norm else nn.Identity()
        self.k_norm = RMSNorm(widths[1], cfg.rms_eps) if norm else nn.Identity()

    def heads(self, qkv: torch.Tensor, rope: RopeInputs) -> Projected:
        cfg = self.cfg
        if cfg.qk_norm_full:  # NOTE: OLMoE: one norm over every head's q (and k), then per-head views
            q, k, v = qkv.split(self.splits, dim=-1)
            qkv = torch.cat((self.q_norm(q), self.k_norm(k), v), dim=-1)
        if not cfg.qk_norm:
            return super().heads(qkv, rope.cos_sin)
        weights = (self.q_norm.weight, self.k_norm.weight)
        heads = (self.num_heads, self.num_kv_heads)
        return (*qk_norm_rope(qkv, heads, cfg.head_dim, weights, cfg.rms_eps, rope), None)


class CausalLM(Decoder):
    """A loaded decoder; ``forward(input_ids [T] int64, positions [T] int64, ctx) -> [T, vocab] fp32``.

    Fused projections: ``attn.qkv`` holds q, k, v rows and ``mlp.gate_up`` gate then up rows
    (``checkpoint.LAYER_TENSORS`` maps checkpoint tensors onto them). With ``tp`` every
    parameter is this rank's shard (``Decoder``'s embedding, MLP and head; the attention here).
    ``kv_scales``: the checkpoint's per-layer K/V scales for an FP8 KV cache, if it has any.
    """

    kv_scales: KVScales | None = None

    def __init__(
        self, cfg: ModelConfig, freq_factors: torch.Tensor | None = None, tp: TPGroup = SINGLE
    ) -> None:
        super().__init__(
            cfg, cfg.head_dim, lambda i: CausalLMAttention(cfg, i, tp), tp, lambda i: layer_mlp(cfg, i, tp)
        )
        self.freq_factors = freq_factors
        self.rope_scale = rope_attention_factor(cfg.rope_type, cfg.rope_params)

    @property
    def num_kv_heads(self) -> int:
        """KV heads this rank stores (its KV cache's head count)."""
        return self.layers[0].attn.num_kv_heads

    def reset_rope(self, device: torch.device) -> None:
        """(Re)compute ``inv_freq`` (float32, on ``device``) from the config's rope type."""
        cfg = self.cfg
        inv_freq = rope_inv_freq(
            cfg.rope_theta, cfg.head_dim, cfg.rope_type, cfg.rope_params, self.freq_factors
        )
        self.inv_freq = inv_freq.to(device)

    def fused_rope_theta(self) -> float | None:
        """``rope_theta`` when sgl-kernel's fused q/k norm + RoPE computes this model's angles
        (q/k norm, default rope type, no frequency factors); else None."""
        cfg = self.cfg
        plain = cfg.rope_type == "default" and self.freq_factors is None
        return cfg.rope_theta if cfg.qk_norm and plain else None

    def rope_inputs(self, positions: torch.Tensor, dtype: torch.dtype) -> RopeInputs:
        """The cos/sin table, plus int32 positions and theta for the fused kernel when it may run."""
        cos_sin = super().rope_inputs(positions, dtype)
        theta = self.fused_rope_theta()
        if theta is not None and positions.is_cuda:
            positions = positions.to(torch.int32)  # NOTE: once per step; the kernel reads int32
        return RopeInputs(cos_sin, positions, theta)

    def row_splits(self) -> dict[str, tuple[int, ...]]:
        """Row sizes of each fused parameter's parts, by parameter-name suffix."""
        cfg = self.cfg
        qkv = self.layers[0].attn.splits
        return {"attn.qkv": qkv, "mlp.gate_up": (cfg.intermediate_size, cfg.intermediate_size)}

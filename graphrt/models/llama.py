"""A tiny Llama-style decoder: RMSNorm (:mod:`graphrt.models.norm`), RoPE, GQA attention, SwiGLU."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from graphrt.attention.context import ForwardContext
from graphrt.models import ops
from graphrt.models.mlp import MLP
from graphrt.models.moe import SparseMoE, layer_mlp
from graphrt.models.norm import RMSNorm
from graphrt.models.parallel import (
    SINGLE,
    ColumnParallelLinear,
    ParallelLMHead,
    RowParallelLinear,
    VocabParallelEmbedding,
    head_param,
    kv_heads,
    scaled,
    split,
)
from graphrt.models.presets import LlamaConfig
from graphrt.parallel import TPGroup

#: What :meth:`Attention.heads` returns: q, k, v and the ``cos_sin`` still to apply to q and
#: k (None when they are rotated already).
Projected = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]


class Attention(nn.Module):
    """GQA attention over this rank's query heads and the KV heads they read (:func:`kv_heads`).

    ``qkv_bias`` / ``o_bias``: biases on the projections (Qwen2's q/k/v, some checkpoints' o).
    ``sinks``: learned attention sinks, one logit per query head (``self.sinks``, this rank's
    heads; gpt-oss). Subclasses change how q, k and v are made from the qkv projection
    (:meth:`heads`), e.g. with per-head q/k norms.
    """

    def __init__(
        self,
        cfg: Any,
        layer_id: int,
        tp: TPGroup = SINGLE,
        qkv_bias: bool = False,
        o_bias: bool = False,
        sinks: bool = False,
    ) -> None:
        super().__init__()
        self.cfg, self.layer_id = cfg, layer_id
        heads, kv = split(cfg.num_heads, tp, "num_heads"), kv_heads(cfg.num_kv_heads, cfg.num_heads, tp)
        self.num_heads, self.num_kv_heads = heads.size, kv.size
        q_part, kv_part = scaled(heads, cfg.head_dim), scaled(kv, cfg.head_dim)
        self.splits = (q_part.size, kv_part.size, kv_part.size)
        self.qkv = ColumnParallelLinear(
            cfg.hidden_size, (q_part, kv_part, kv_part), ("q", "k", "v"), bias=qkv_bias
        )
        self.o = RowParallelLinear(q_part, cfg.hidden_size, tp, bias=o_bias)
        self.sinks = head_param(heads) if sinks else None

    def heads(self, qkv: torch.Tensor, rope: Any) -> Projected:
        """``(q [T, Hq, D], k [T, Hk, D], v [T, Hk, D], cos_sin [T, D])`` of the projection
        ``qkv [T, (Hq + 2 Hk) D]``: views of it, q and k still to be rotated by ``rope`` (this
        step's ``cos_sin``), which the attention context does as it stores k (one fused kernel
        on GPU)."""
        d = self.cfg.head_dim
        q, k, v = qkv.split(self.splits, dim=-1)
        heads = (self.num_heads, self.num_kv_heads, self.num_kv_heads)
        q, k, v = (t.view(-1, h, d) for t, h in zip((q, k, v), heads, strict=True))
        return q, k, v, rope

    def attend(self, projected: Projected, ctx: ForwardContext) -> torch.Tensor:
        """Attention over ``projected`` (:meth:`heads`), then the output projection: ``[T, hidden]``."""
        cfg, layer = self.cfg, self.layer_id
        q, k, v, pending = projected
        out = ctx.attention(
            layer, q, k, v, window=cfg.window(layer), chunk=cfg.chunk(layer), rope=pending, sinks=self.sinks
        )
        return self.o(out.reshape(-1, self.splits[0]))

    def forward(self, x: torch.Tensor, rope: Any, ctx: ForwardContext) -> torch.Tensor:
        return self.attend(self.heads(self.qkv(x), rope), ctx)


class Block(nn.Module):
    """Pre-norm residual block around any attention module with ``forward(x, cos_sin, ctx)``.

    The residual stream travels beside the block's output: each norm adds the previous
    sublayer's output to it first (``RMSNorm.add``, one fused kernel on GPU). Each norm goes
    with the projection after it (``RMSNorm.linear``: qkv of an :class:`Attention`, the MLP's
    gate_up) and SiLU-and-mul with ``down`` (``MLP.gated_down``): a single-row step computes
    them in the GEMMs' prologues (:mod:`graphrt.kernels.prologue`), any other step runs the same
    ops as the unfused path. Under TP those projections are column-parallel (no collective
    between the norm and the GEMM) and ``down`` is all-reduced after its GEMM, as unfused.
    A normed row with several consumers goes with one GEMM that also hands it back
    (``RMSNorm.linear_keep``): a :class:`~graphrt.models.moe.SparseMoE`'s router (the layer gets
    the logits and ``ctx``; its experts read the row) and, where ``attn.fuses_norm``, MLA's first
    q projection (``kv_a_proj_with_mqa`` reads the row). With ``takes_ctx`` an MLP gets ``ctx``.
    """

    def __init__(self, hidden_size: int, eps: float, attn: nn.Module, mlp: nn.Module) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(hidden_size, eps)
        self.attn = attn
        self.mlp_norm = RMSNorm(hidden_size, eps)
        self.mlp = mlp
        self.norms_in_projections = isinstance(mlp, MLP)
        self.norm_in_router = isinstance(mlp, SparseMoE)
        self.mlp_takes_ctx = getattr(mlp, "takes_ctx", False)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, cos_sin: Any, ctx: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``x``: the previous sublayer's output (the embedding for the first block, with
        ``residual`` None). ``cos_sin``: the decoder's ``rope_inputs`` (passed to the attention).
        Returns this block's MLP output and the residual stream before it."""
        out, residual = self._attention(x, residual, cos_sin, ctx)
        if self.norms_in_projections:
            gate_up, residual = self.mlp_norm.linear(out, residual, self.mlp.gate_up)
            return self.mlp.gated_down(gate_up), residual
        if self.norm_in_router:
            logits, h, residual = self.mlp_norm.linear_keep(out, residual, self.mlp.gate)
            return self.mlp(h, ctx, logits=logits), residual
        h, residual = self.mlp_norm.add(out, residual)
        return (self.mlp(h, ctx) if self.mlp_takes_ctx else self.mlp(h)), residual

    def _attention(
        self, x: torch.Tensor, residual: torch.Tensor | None, cos_sin: Any, ctx: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(self.attn, Attention):  # NOTE: the norm in the qkv GEMM's prologue, MoE or not
            qkv, residual = self.attn_norm.linear(x, residual, self.attn.qkv)
            return self.attn.attend(self.attn.heads(qkv, cos_sin), ctx), residual
        if getattr(self.attn, "fuses_norm", False):  # NOTE: MLA: in q's first GEMM, kv_a reads the row
            q_first, h, residual = self.attn_norm.linear_keep(x, residual, self.attn.norm_projection())
            return self.attn(h, cos_sin, ctx, q_first=q_first), residual
        h, residual = self.attn_norm.stream(x, residual)  # NOTE: DSA: unfused (its own projections)
        return self.attn(h, cos_sin, ctx), residual


def seeded(model: nn.Module, seed: int, device: torch.device, dtype: torch.dtype) -> Any:
    """Random weights from ``seed``, std ``1/sqrt(fan_in)`` (the contracted dim), norms at 1,
    embeddings and attention sinks std 1.

    Logits get a usable spread; ``inv_freq`` (RoPE angles) stays float32 in any dtype. Sharded
    parameters draw their *full* tensor and keep their slice (``weight_loader``), so every TP
    size holds the same model.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                continue
            shape = getattr(p, "full_shape", p.shape)
            per_token = "embed" in name or name.endswith("sinks")  # NOTE: nothing is contracted
            # NOTE: experts' ``[E, out, in]`` contract their last dim like any linear
            stacked = len(shape) == 3 and ".experts." not in name
            fan_in = 1 if per_token else (shape[-2] if stacked else shape[-1])
            full = torch.randn(shape, generator=gen) * fan_in**-0.5
            getattr(p, "weight_loader", _copy)(p, full)
    model = model.to(device=device, dtype=dtype).eval()
    model.inv_freq = model.inv_freq.float()
    return model


def _copy(param: nn.Parameter, loaded: torch.Tensor) -> None:
    param.copy_(loaded)


class Decoder(nn.Module):
    """Embedding, ``num_layers`` blocks, final norm and LM head; the attention is the model's.

    ``forward(input_ids [T] int64, positions [T] int64, ctx) -> logits [T, vocab] float32``.
    ``mlp(layer_id)`` builds each layer's MLP (default: the dense :class:`MLP`; MoE models
    pass :func:`graphrt.models.moe.layer_mlp`).
    """

    def __init__(
        self,
        cfg: Any,
        rope_dim: int,
        attention: Callable[[int], nn.Module],
        tp: TPGroup = SINGLE,
        mlp: Callable[[int], nn.Module] | None = None,
    ) -> None:
        super().__init__()
        self.cfg, self.tp = cfg, tp
        self.embed = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, tp)
        self.layers = nn.ModuleList(
            Block(cfg.hidden_size, cfg.rms_eps, attention(i), MLP(cfg, tp) if mlp is None else mlp(i))
            for i in range(cfg.num_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.lm_head = ParallelLMHead(cfg.hidden_size, cfg.vocab_size, tp)
        # NOTE: computed on the CPU, then moved: arange and pow on the meta device (where a
        # checkpoint's model is built) run through torch._refs, whose first call imports
        # torch._dynamo (0.9 s of a cold start)
        exponent = torch.arange(0, rope_dim, 2, dtype=torch.float64, device="cpu") / rope_dim
        inv_freq = (cfg.rope_theta**-exponent).float().to(self.norm.weight.device)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        #: What cos/sin are multiplied by (YaRN's attention factor; 1: none): a model whose rope
        #: has one sets it (``rope.rope_attention_factor``), q and k are both rotated by it.
        self.rope_scale = 1.0
        self.tie()

    def tie(self) -> None:
        """Share the embedding with the LM head when the config ties them (after every move
        that makes new parameters, e.g. ``to_empty``).

        Both hold the same vocabulary rows on every rank (``vocab_split``), so a shard ties too.
        """
        if getattr(self.cfg, "tie_word_embeddings", False):
            self.lm_head.weight = self.embed.weight

    @classmethod
    def from_seed(
        cls, cfg: Any, seed: int, device: torch.device, dtype: torch.dtype, tp: TPGroup = SINGLE
    ) -> Any:
        """Random weights from ``seed``; with ``tp``, this rank's shards of the same weights."""
        return seeded(cls(cfg, tp) if tp.size > 1 else cls(cfg), seed, device, dtype)

    @property
    def vocab_size(self) -> int:
        return self.cfg.vocab_size

    def routing_shape(self) -> Any:
        """The routing buffers the runtime allocates for this model: the first MoE layer's
        ``routing_shape()`` (:class:`~graphrt.metadata.routing.RoutingShape`), None if it has none."""
        for layer in self.layers:
            shape = getattr(layer.mlp, "routing_shape", None)
            if shape is not None:
                return shape()
        return None

    def rope_inputs(self, positions: torch.Tensor, dtype: torch.dtype) -> Any:
        """What every layer's attention gets for RoPE, made once per step: ``[T, rope_dim]`` cos/sin
        (times :attr:`rope_scale`)."""
        cos_sin = ops.rope_cos_sin(positions, self.inv_freq, dtype)
        return cos_sin if self.rope_scale == 1.0 else cos_sin * self.rope_scale

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: Any) -> torch.Tensor:
        x = self.embed(input_ids)
        cos_sin = self.rope_inputs(positions, x.dtype)  # NOTE: once per step, every layer
        residual = None
        for layer in self.layers:
            x, residual = layer(x, residual, cos_sin, ctx)
        rows = ctx.head_rows
        if rows is not None:  # NOTE: only the rows a sampling step samples from (head_rows)
            x, residual = x[rows], residual[rows]
        if self.tp.size == 1:  # NOTE: the final norm in the head's prologue (one rank: no all-gather)
            return self.norm.linear(x, residual, self.lm_head)[0].float()
        return self.lm_head(self.norm.add(x, residual)[0]).float()


class TinyLlama(Decoder):
    """A Llama-style decoder: GQA attention through ``ctx.attention``; tensor-parallel with ``tp``."""

    def __init__(self, cfg: LlamaConfig, tp: TPGroup = SINGLE) -> None:
        attention = lambda i: Attention(cfg, i, tp, sinks=cfg.sinks)  # noqa: E731
        super().__init__(cfg, cfg.head_dim, attention, tp, lambda i: layer_mlp(cfg, i, tp))

    @property
    def num_kv_heads(self) -> int:
        """KV heads this rank stores (its KV cache's head count)."""
        return self.layers[0].attn.num_kv_heads

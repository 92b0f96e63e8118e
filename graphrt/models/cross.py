"""The ``tiny-cross`` encoder-decoder: a small bidirectional encoder and a decoder whose layers
alternate self-attention and cross-attention over the encoder's output.

The encoder runs once per request, eagerly, outside any graph (:meth:`CrossDecoder.encode_into`):
its output is projected to each cross layer's K/V and written into the
:class:`~graphrt.kv.EncoderKV` cache. Decoder steps (``forward(input_ids, positions, ctx)``, the
same as every model's) then read it through ``ctx.cross_attention``: DECODE replays a graph.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from graphrt.attention.context import ForwardContext
from graphrt.kv import EncoderKV
from graphrt.models import ops
from graphrt.models.llama import MLP, Attention, Decoder
from graphrt.models.norm import RMSNorm
from graphrt.models.parallel import SINGLE
from graphrt.models.presets import CrossConfig
from graphrt.parallel import TPGroup


class CrossAttention(nn.Module):
    """A decoder layer's attention to the encoder: queries from the decoder, keys and values
    projected from the encoder's output (:meth:`encoder_kv`, once per request). No RoPE."""

    def __init__(self, cfg: CrossConfig, cross_id: int) -> None:
        super().__init__()
        self.cfg, self.cross_id = cfg, cross_id
        d = cfg.head_dim
        self.q = ops.Linear(cfg.hidden_size, cfg.num_heads * d, bias=False)
        self.kv = ops.Linear(cfg.hidden_size, 2 * cfg.num_kv_heads * d, bias=False)
        self.o = ops.Linear(cfg.num_heads * d, cfg.hidden_size, bias=False)

    def encoder_kv(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``k``, ``v [L, num_kv_heads, head_dim]`` of the encoder output ``hidden [L, hidden]``."""
        k, v = self.kv(hidden).view(hidden.shape[0], 2, self.cfg.num_kv_heads, self.cfg.head_dim).unbind(1)
        return k, v

    def forward(self, x: torch.Tensor, rope: object, ctx: ForwardContext) -> torch.Tensor:
        q = self.q(x).view(x.shape[0], self.cfg.num_heads, self.cfg.head_dim)
        return self.o(ctx.cross_attention(self.cross_id, q).reshape(x.shape[0], -1))


class EncoderLayer(nn.Module):
    """Pre-norm bidirectional self-attention and SwiGLU over one request's encoder tokens."""

    def __init__(self, cfg: CrossConfig) -> None:
        super().__init__()
        self.cfg, d = cfg, cfg.head_dim
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.qkv = ops.Linear(cfg.hidden_size, (cfg.num_heads + 2 * cfg.num_kv_heads) * d, bias=False)
        self.o = ops.Linear(cfg.num_heads * d, cfg.hidden_size, bias=False)
        self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [L, hidden]`` → ``[L, hidden]``; every token sees every token (no mask)."""
        cfg, n = self.cfg, x.shape[0]
        heads = (cfg.num_heads, cfg.num_kv_heads, cfg.num_kv_heads)
        q, k, v = self.qkv(self.attn_norm(x)).split([h * cfg.head_dim for h in heads], dim=-1)
        q, k, v = (t.view(n, h, cfg.head_dim).transpose(0, 1) for t, h in zip((q, k, v), heads, strict=True))
        group = cfg.num_heads // cfg.num_kv_heads
        k, v = k.repeat_interleave(group, dim=0), v.repeat_interleave(group, dim=0)
        scores = (q.float() @ k.float().transpose(1, 2)) * cfg.head_dim**-0.5
        out = (scores.softmax(dim=-1) @ v.float()).to(x.dtype).transpose(0, 1).reshape(n, -1)
        x = x + self.o(out)
        return x + self.mlp(self.mlp_norm(x))


class Encoder(nn.Module):
    """Token and learned position embeddings, ``encoder_layers`` blocks, a final norm."""

    def __init__(self, cfg: CrossConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.encoder_vocab_size, cfg.hidden_size)
        self.pos_embed = nn.Embedding(cfg.max_encoder_len, cfg.hidden_size)
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """``ids [L]`` int64 → encoder output ``[L, hidden]``."""
        x = self.embed(ids) + self.pos_embed(torch.arange(ids.shape[0], device=ids.device))
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class CrossDecoder(Decoder):
    """The encoder-decoder; ``forward(input_ids [T] int64, positions [T] int64, ctx) -> [T, vocab]
    fp32`` is the decoder step. Self-attention layer ``i`` (even) uses decoder KV layer ``i // 2``,
    cross layer ``i`` (odd) encoder KV layer ``i // 2``. One rank only.
    """

    def __init__(self, cfg: CrossConfig, tp: TPGroup = SINGLE) -> None:
        if tp.size > 1:
            raise ValueError(f"tensor parallelism (tp {tp.size}) is not supported for encoder-decoder models")

        def attention(i: int) -> nn.Module:
            return CrossAttention(cfg, i // 2) if cfg.is_cross(i) else Attention(cfg, i // 2)

        super().__init__(cfg, cfg.head_dim, attention)
        self.encoder = Encoder(cfg)

    @property
    def num_kv_heads(self) -> int:
        return self.cfg.num_kv_heads

    def encoder_ids(self, ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """``ids`` as an int64 tensor on the model's device; ``ValueError`` naming the value and
        the limit for an empty, too long or out-of-vocabulary input."""
        cfg = self.cfg
        t = torch.as_tensor(ids, dtype=torch.int64).reshape(-1)
        if not 1 <= t.numel() <= cfg.max_encoder_len:
            raise ValueError(
                f"encoder input of {t.numel()} tokens: must be 1..{cfg.max_encoder_len} (max_encoder_len)"
            )
        bad = (t < 0) | (t >= cfg.encoder_vocab_size)
        if bad.any():
            raise ValueError(f"encoder token id {int(t[bad][0])} out of range [0, {cfg.encoder_vocab_size})")
        return t.to(self.norm.weight.device)

    @torch.no_grad()
    def encoder_kv(self, ids: Sequence[int] | torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each cross layer's ``(k, v)`` ``[L, num_kv_heads, head_dim]`` for encoder input ``ids``."""
        hidden = self.encoder(self.encoder_ids(ids))
        return [b.attn.encoder_kv(hidden) for b in self.layers if isinstance(b.attn, CrossAttention)]

    def encode_into(self, cache: EncoderKV, row: int, ids: Sequence[int] | torch.Tensor) -> None:
        """Run the encoder on ``ids`` and write every cross layer's K/V for request row ``row``.

        Checks come first (``ValueError``: bad ids, too long for the cache, bad row), so bad
        input writes nothing. Once per request, before its first step.
        """
        tokens = self.encoder_ids(ids)
        cache.check_write(row, tokens.numel())
        cache.write(row, self.encoder_kv(tokens))

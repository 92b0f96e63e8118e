"""A tiny DeepSeek-V3.2-style decoder: MLA with absorbed up-projections and a DSA indexer.

Per layer: the indexer scores past tokens and keeps ``index_topk`` per query token
(``ctx.index_topk``); attention is MQA over the shared 576-wide latent row
(``ctx.sparse_mla``) with ``W_UK`` folded into the query and ``W_UV`` applied to the output.
"""

from __future__ import annotations

import torch
from torch import nn

from graphrt.attention.sparse_context import SparseMLAContext
from graphrt.models import ops
from graphrt.models.llama import Decoder
from graphrt.models.norm import RMSNorm
from graphrt.models.ops import apply_rope_ref
from graphrt.models.presets import DSAConfig


class Indexer(nn.Module):
    """DeepSeek-V3.2's lightning indexer: ``index_heads`` queries, one key, per-head weights."""

    def __init__(self, cfg: DSAConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wq = ops.Linear(cfg.hidden_size, cfg.index_heads * cfg.index_dim, bias=False)
        self.wk = ops.Linear(cfg.hidden_size, cfg.index_dim, bias=False)
        self.weights = ops.Linear(cfg.hidden_size, cfg.index_heads, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q = self.wq(x).view(-1, self.cfg.index_heads, self.cfg.index_dim)
        return q, self.wk(x), self.weights(x) * self.cfg.index_heads**-0.5


class MLAAttention(nn.Module):
    def __init__(self, cfg: DSAConfig, layer_id: int) -> None:
        super().__init__()
        self.cfg, self.layer_id = cfg, layer_id
        h, c = cfg.num_heads, cfg.kv_lora_rank
        self.q_proj = ops.Linear(cfg.hidden_size, h * (cfg.qk_nope_dim + cfg.qk_rope_dim), bias=False)
        self.kv_a = ops.Linear(cfg.hidden_size, c + cfg.qk_rope_dim, bias=False)
        self.kv_norm = RMSNorm(c, cfg.rms_eps)
        self.w_uk = nn.Parameter(torch.empty(h, cfg.qk_nope_dim, c))  # k_nope[h] = W_UK[h] @ c_kv
        self.w_uv = nn.Parameter(torch.empty(h, c, cfg.v_head_dim))  # v[h] = c_kv @ W_UV[h]
        self.o = ops.Linear(h * cfg.v_head_dim, cfg.hidden_size, bias=False)
        self.indexer = Indexer(cfg)
        self.scale = (cfg.qk_nope_dim + cfg.qk_rope_dim) ** -0.5

    def forward(self, x: torch.Tensor, cos_sin: torch.Tensor, ctx: SparseMLAContext) -> torch.Tensor:
        cfg = self.cfg
        q = self.q_proj(x).view(-1, cfg.num_heads, cfg.qk_nope_dim + cfg.qk_rope_dim)
        q_nope, q_rope = q.split((cfg.qk_nope_dim, cfg.qk_rope_dim), dim=-1)
        latent, k_rope = self.kv_a(x).split((cfg.kv_lora_rank, cfg.qk_rope_dim), dim=-1)
        k_rope = apply_rope_ref(k_rope[:, None], cos_sin)[:, 0]
        # NOTE: absorbed form — q . (W_UK c) == (q W_UK) . c, so the cache holds only c_kv.
        q_full = torch.cat(
            (torch.einsum("thn,hnc->thc", q_nope, self.w_uk), apply_rope_ref(q_rope, cos_sin)), -1
        )
        ctx.index_topk(self.layer_id, *self.indexer(x))
        out = ctx.sparse_mla(self.layer_id, q_full, torch.cat((self.kv_norm(latent), k_rope), -1), self.scale)
        out = torch.einsum("thc,hcv->thv", out, self.w_uv)
        return self.o(out.reshape(-1, cfg.num_heads * cfg.v_head_dim))


class TinyDSA(Decoder):
    """A DSA decoder: MLA with a lightning indexer through ``ctx.index_topk`` / ``ctx.sparse_mla``."""

    def __init__(self, cfg: DSAConfig) -> None:
        super().__init__(cfg, cfg.qk_rope_dim, lambda i: MLAAttention(cfg, i))

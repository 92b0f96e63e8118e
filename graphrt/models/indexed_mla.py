"""DeepSeek-V3.2: DeepSeek-V3's MLA and MoE with a DSA indexer, through the sparse-MLA path.

As transformers' ``DeepseekV32Attention``: the MLA projections and interleaved RoPE are V3's
(:class:`~graphrt.models.mla.LatentAttention`), and each layer's indexer
(:class:`~graphrt.models.indexer.Indexer`) keeps ``index_topk`` causal keys per query token;
attention sees only those. graphrt runs it in the absorbed form over the sparse-MLA cache
(:class:`~graphrt.kv.MLAKVCache`, FlashMLA's 512 + 64 latent row): ``ctx.index_topk`` writes the
chosen slots into the static ``topk_slots`` buffer, ``ctx.sparse_mla`` attends over them. The
MLPs are V3's (dense for the first ``first_k_dense_replace`` layers, then MoE).
"""

from __future__ import annotations

import torch

from graphrt.attention.sparse_context import SparseMLAContext
from graphrt.kv.mla import KV_LORA_RANK, ROPE_DIM
from graphrt.models.indexer import Indexer
from graphrt.models.mla import LatentAttention, MLACausalLM
from graphrt.models.parallel import SINGLE
from graphrt.models.presets import MLAConfig
from graphrt.parallel import TPGroup


def check_dsa_shape(cfg: MLAConfig) -> None:
    """Raise ``ValueError`` unless ``cfg`` fits the sparse-MLA cache: an indexer, a q LoRA (the
    indexer's queries read it), and DeepSeek's latent 512 + RoPE 64 (FlashMLA's row)."""
    if cfg.indexer is None:
        raise ValueError("a DSA model needs an indexer (index_n_heads, index_head_dim, index_topk)")
    if cfg.q_lora_rank is None:
        raise ValueError("DeepSeek-V3.2 needs q_lora_rank: the indexer's queries read the q LoRA")
    if (cfg.kv_lora_rank, cfg.qk_rope_head_dim) != (KV_LORA_RANK, ROPE_DIM):
        raise ValueError(
            f"sparse MLA needs kv_lora_rank {KV_LORA_RANK} and qk_rope_head_dim {ROPE_DIM} "
            f"(FlashMLA's latent row); the config has {cfg.kv_lora_rank} and {cfg.qk_rope_head_dim}"
        )


class IndexedLatentAttention(LatentAttention):
    """One layer's MLA with its indexer: ``ctx.index_topk`` then ``ctx.sparse_mla``."""

    #: NOTE: the block's attention norm runs unfused here: this forward makes its own
    #: projections of the normed row (the indexer's included) and takes no ``q_first``.
    fuses_norm = False

    def __init__(self, cfg: MLAConfig, layer_id: int) -> None:
        super().__init__(cfg, layer_id)
        check_dsa_shape(cfg)
        assert cfg.indexer is not None and cfg.q_lora_rank is not None  # NOTE: checked above
        self.indexer = Indexer(cfg.indexer, cfg.hidden_size, cfg.q_lora_rank, cfg.qk_rope_head_dim)

    def forward(self, x: torch.Tensor, cos_sin: torch.Tensor, ctx: SparseMLAContext) -> torch.Tensor:
        cfg = self.cfg
        q_resid = self.q_a_layernorm(self.q_a_proj(x))
        q = self.q_b_proj(q_resid).view(x.shape[0], cfg.num_heads, -1)
        q_nope, q_rope = q.split((cfg.qk_nope_head_dim, cfg.qk_rope_head_dim), dim=-1)
        latent, k_rope = self.kv_a_proj_with_mqa(x).split((cfg.kv_lora_rank, cfg.qk_rope_head_dim), dim=-1)
        w_uk, w_uv = self.up_projections()
        # NOTE: absorbed form — q_nope . (W_UK c) == (q_nope W_UK) . c: the cache holds only c.
        q_full = torch.cat((torch.einsum("thn,hnc->thc", q_nope, w_uk), self.rotate(q_rope, cos_sin)), dim=-1)
        row = torch.cat((self.kv_a_layernorm(latent), self.rotate(k_rope[:, None], cos_sin)[:, 0]), dim=-1)
        ctx.index_topk(self.layer_id, *self.indexer(x, q_resid, cos_sin), scale=self.indexer.scale)
        out = ctx.sparse_mla(self.layer_id, q_full, row, cfg.softmax_scale)
        out = torch.einsum("thc,hvc->thv", out, w_uv)
        return self.o_proj(out.reshape(x.shape[0], cfg.num_heads * cfg.v_head_dim))


class DSACausalLM(MLACausalLM):
    """A DeepSeek-V3.2 decoder; ``forward(input_ids [T] int64, positions [T] int64, ctx)``.

    ``ctx`` is a :class:`~graphrt.attention.SparseMLAContext` (the runtime builds one for an
    :class:`~graphrt.kv.MLAKVCache`). One rank only: tensor parallelism is refused.
    """

    attention_layer = IndexedLatentAttention

    def __init__(self, cfg: MLAConfig, tp: TPGroup = SINGLE) -> None:
        check_dsa_shape(cfg)
        super().__init__(cfg, tp)


def mla_decoder(cfg: MLAConfig) -> type[MLACausalLM]:
    """The decoder class of an MLA config: sparse (with an indexer) or dense MLA."""
    return DSACausalLM if cfg.indexer is not None else MLACausalLM

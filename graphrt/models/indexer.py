"""DeepSeek-V3.2's lightning indexer (DSA) as transformers' ``DeepseekV32Indexer`` computes it.

Per query token ``t`` and past key ``j`` the indexer scores
``sum_h w[t, h] * relu(scale * q[t, h] . k[j])`` with ``w = weights_proj(x) / sqrt(n_heads)``
and ``scale = index_head_dim ** -0.5``; the ``index_topk`` best causal keys are the only ones
the sparse MLA attends to. ``q = wq_b(q_resid)`` (the MLA's normed q LoRA), ``k =
LayerNorm(wk(x))``; the first ``qk_rope_head_dim`` values of each are rotated by NeoX halves
(unlike the MLA's interleaved RoPE), the rest pass. DeepSeek's reference also applies a
Hadamard rotation and FP8-quantises q and k; transformers skips both (the rotation is
orthogonal, so dot products are unchanged) and so does graphrt: selection follows transformers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from graphrt.kv.rope_store import rotate_ref
from graphrt.models import ops

#: NOTE: transformers builds the indexer's ``k_norm`` (a LayerNorm with bias) with eps 1e-6.
K_NORM_EPS = 1e-6


@dataclass(frozen=True, slots=True)
class IndexerSpec:
    """A DSA model's indexer: ``n_heads`` query heads of ``head_dim`` (transformers'
    ``index_n_heads`` / ``index_head_dim``), keeping ``topk`` keys per query (``index_topk``)."""

    n_heads: int
    head_dim: int
    topk: int

    def __post_init__(self) -> None:
        for name in ("n_heads", "head_dim", "topk"):
            if getattr(self, name) < 1:
                raise ValueError(f"indexer {name} = {getattr(self, name)}: must be >= 1")


class Indexer(nn.Module):
    """One layer's indexer; submodules keep transformers' names (``wq_b``, ``wk``, ``k_norm``,
    ``weights_proj``) so a checkpoint maps onto them one to one."""

    def __init__(self, spec: IndexerSpec, hidden_size: int, q_lora_rank: int, rope_dim: int) -> None:
        super().__init__()
        if spec.head_dim < rope_dim:
            raise ValueError(
                f"index_head_dim {spec.head_dim} must be >= qk_rope_head_dim {rope_dim} (its RoPE part)"
            )
        self.spec, self.rope_dim = spec, rope_dim
        self.wq_b = ops.Linear(q_lora_rank, spec.n_heads * spec.head_dim, bias=False)
        self.wk = ops.Linear(hidden_size, spec.head_dim, bias=False)
        self.k_norm = nn.LayerNorm(spec.head_dim, eps=K_NORM_EPS)
        self.weights_proj = ops.Linear(hidden_size, spec.n_heads, bias=False)
        self.scale = spec.head_dim**-0.5

    def _rotate(self, x: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
        r = self.rope_dim
        return torch.cat((rotate_ref(x[..., :r], cos_sin), x[..., r:]), dim=-1)

    def forward(
        self, x: torch.Tensor, q_resid: torch.Tensor, cos_sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(q [T, n_heads, head_dim], k [T, head_dim], weights [T, n_heads] float32)`` of ``x [T, hidden]``
        and ``q_resid [T, q_lora_rank]``, rotated by ``cos_sin [T, rope_dim]``: what
        ``ctx.index_topk(layer, q, k, weights, scale)`` scores."""
        spec = self.spec
        q = self._rotate(self.wq_b(q_resid).view(-1, spec.n_heads, spec.head_dim), cos_sin)
        k = self._rotate(self.k_norm(self.wk(x))[:, None], cos_sin)[:, 0]
        # NOTE: the head weights in float32, as transformers keeps ``weights_proj`` (its
        # ``_keep_in_fp32_modules``): a bf16 product would round near-tied scores apart.
        weights = nn.functional.linear(x.float(), self.weights_proj.weight.float())
        return q, k, weights * spec.n_heads**-0.5

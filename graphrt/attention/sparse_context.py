"""The forward context of a sparse-MLA (DSA) model: indexer top-k, then sparse MLA."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from graphrt.attention.base import AttentionBackend
from graphrt.attention.call import AttendCall
from graphrt.attention.context import ModelInputs
from graphrt.kv import ReqToToken
from graphrt.kv.mla import MLAKVCache
from graphrt.metadata.base import StepMetadata
from graphrt.metadata.sparse import Candidates, SparseBuffers, select_topk, step_candidates

_UNPLANNED = object()


class SparseMLAContext(ModelInputs):
    """Per-step handle a DSA model's forward receives as ``ctx``.

    Per layer the model calls :meth:`index_topk` (indexer keys stored, top-k written into
    the static ``topk_indices`` / ``topk_slots``), then :meth:`sparse_mla`. The backend's
    plan (FlashMLA's FP8 tile schedule) runs once, at the first :meth:`sparse_mla` of the step.
    The model's own inputs: :class:`~graphrt.attention.context.ModelInputs`.
    """

    def __init__(
        self,
        meta: StepMetadata,
        kv: MLAKVCache,
        backend: AttentionBackend,
        sparse: SparseBuffers,
        req_to_token: ReqToToken,
    ) -> None:
        self.meta, self.kv, self.backend, self.sparse, self.req_to_token = (
            meta,
            kv,
            backend,
            sparse,
            req_to_token,
        )
        self._plan: Any = _UNPLANNED
        # NOTE: one context per forward (every draft step builds its own), so the candidate
        # keys follow that forward's positions and tree; shared by all its layers.
        self._keys: Candidates | None = None

    @property
    def mode(self):
        return self.meta.mode

    def index_topk(
        self, layer_id: int, q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor, scale: float = 1.0
    ) -> None:
        """Store indexer keys, score past keys and keep ``index_topk`` per query token.

        ``q [T, index_heads, index_dim]``, ``k [T, index_dim]``, ``weights [T, index_heads]``;
        score of key ``j`` for token ``t``: ``sum_h weights[t, h] * relu(scale * q[t, h] . k_j)``
        (DeepSeek-V3.2's lightning indexer, in transformers' order of operations), float32. The
        keys are the token's candidates (:func:`~graphrt.metadata.sparse.step_candidates`:
        causal, or prefix + ancestors in a tree).
        """
        step = self.meta.buffers
        self.kv.index_k[layer_id].index_copy_(0, step.out_cache_loc, k.to(self.kv.index_k[layer_id].dtype))
        if self._keys is None:
            self._keys = step_candidates(self.meta, self.req_to_token)
        keys = self.kv.index_k[layer_id][self._keys.slots].float()  # [T, C, index_dim]
        logits = (torch.einsum("thd,tjd->thj", q.float(), keys) * scale).relu()
        scores = torch.einsum("thj,th->tj", logits, weights.float())
        select_topk(scores, self._keys, self.sparse)

    def sparse_mla(self, layer_id: int, q: torch.Tensor, latent: torch.Tensor, scale: float) -> torch.Tensor:
        """Store ``latent [T, 576]`` at ``out_cache_loc``, attend over the selected slots.

        ``q [T, num_heads, 576]`` (absorbed: ``q_nope @ W_UK`` then ``q_rope``); returns
        ``[T, num_heads, 512]`` (apply ``W_UV`` after).
        """
        self.kv.store_latent(layer_id, self.meta.buffers.out_cache_loc, latent)
        cache = self.kv.kv[layer_id]
        call = AttendCall(q, cache, cache, self.meta, scale, group=self.sparse)
        if self._plan is _UNPLANNED:
            self._plan = self.backend.plan(call)
        return self.backend.forward(dataclasses.replace(call, plan=self._plan))

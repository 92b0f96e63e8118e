"""The forward context of a dense-MLA model (DeepSeek-V2/V3 style): ``ctx.mla`` per layer.

The model hands over the absorbed query (``q_rope`` and ``qv = q_nope W_UK``) and the token's
cache entries (RoPE key and latent); the context stores them, runs the backend's plan once
per forward (FA3: its tile schedule) and attends with the RoPE cache as keys and the latent
cache as values, ``qv`` scoring against the latents.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from graphrt.attention.call import AttendCall
from graphrt.attention.context import ContextInputs, ModelInputs, attach_model_inputs
from graphrt.kv.latent import LatentKVCache
from graphrt.metadata.base import StepMetadata
from graphrt.step.modes import ForwardMode

#: The plan of a context whose backend has not planned yet (None is a valid plan).
_UNPLANNED = object()


class MLAContext(ModelInputs):
    """Per-step handle a dense-MLA model's forward receives as ``ctx``.

    ``group``: the backend's own buffer group (its view for this step), if any; the model's
    own inputs: :class:`ModelInputs`.
    """

    def __init__(self, meta: StepMetadata, kv: LatentKVCache, backend: Any, group: Any = None) -> None:
        self.meta, self.kv, self.backend, self.group = meta, kv, backend, group
        self._plan: Any = _UNPLANNED

    @classmethod
    def from_inputs(cls, inputs: ContextInputs) -> MLAContext:
        # NOTE: dense-MLA models have neither sliding windows nor chunked-local layers.
        assert inputs.local is None, "chunked-local attention is an MHA feature"
        return attach_model_inputs(cls(inputs.meta, inputs.kv, inputs.backend, inputs.group), inputs)

    @property
    def mode(self) -> ForwardMode:
        """The step's :class:`~graphrt.step.ForwardMode`."""
        return self.meta.mode

    def mla(
        self,
        layer_id: int,
        q_rope: torch.Tensor,
        qv: torch.Tensor,
        k_rope: torch.Tensor,
        latent: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        """Store ``k_rope [T, rope_dim]`` and ``latent [T, kv_lora_rank]`` at ``out_cache_loc``,
        then attend causally (:meth:`store`, then :meth:`attend`)."""
        self.store(layer_id, k_rope, latent)
        return self.attend(layer_id, q_rope, qv, scale)

    def store(self, layer_id: int, k_rope: torch.Tensor, latent: torch.Tensor) -> None:
        """Write ``k_rope [T, rope_dim]`` (rotated) and ``latent [T, kv_lora_rank]`` (normed) at
        the step's ``out_cache_loc``."""
        self.kv.store(layer_id, self.meta.buffers.out_cache_loc, k_rope, latent)

    def cache(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(rope [pages, page_size, 1, rope_dim], latent [pages, page_size, 1, kv_lora_rank],
        out_cache_loc [T] int64)``: where a fused kernel stores the layer's new tokens itself
        (:mod:`graphrt.kv.latent_store`) instead of :meth:`store`."""
        return self.kv.rope[layer_id], self.kv.latent[layer_id], self.meta.buffers.out_cache_loc

    def attend(self, layer_id: int, q_rope: torch.Tensor, qv: torch.Tensor, scale: float) -> torch.Tensor:
        """Attend causally over the layer's caches, this step's tokens already stored.

        ``q_rope [T, H, rope_dim]`` (rotated) and ``qv [T, H, kv_lora_rank]`` (``q_nope`` times
        each head's ``W_UK``); key ``j`` scores ``(q_rope . k_rope_j + qv . latent_j) * scale``.
        Returns ``[T, H, kv_lora_rank]`` in ``q_rope``'s dtype: the probabilities times the
        latents (apply each head's ``W_UV`` after).
        """
        call = AttendCall(q_rope, self.kv.rope[layer_id], self.kv.latent[layer_id], self.meta, scale, qv=qv)
        if self._plan is _UNPLANNED:
            # NOTE: once per forward, before the first layer attends: every layer reads it.
            self._plan = self.backend.plan(dataclasses.replace(call, group=self.group))
        return self.backend.forward(dataclasses.replace(call, plan=self._plan))

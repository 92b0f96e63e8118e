"""The sparse-MLA backend contract, selection by availability, and the torch reference.

A sparse-MLA backend attends each query token over the ``index_topk`` KV slots its indexer
chose (``topk_slots``, −1 = no key), in the absorbed MQA form FlashMLA uses: one shared
latent row ``[576]`` per token is both the key and (its first 512 values) the value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

from graphrt.metadata import StepMetadata
from graphrt.mla_cache import KV_LORA_RANK, MLAKVCache
from graphrt.sparse_metadata import SparseBuffers


class SparseMLABackend(Protocol):
    """Sparse MLA over an :class:`MLAKVCache`.

    ``plan`` runs once per step before the first layer (inside the graph on the graph path)
    and returns what every layer's ``forward`` needs from it. ``forward`` takes
    ``q [num_tokens, num_heads, 576]`` and returns ``[num_tokens, num_heads, 512]`` in
    ``q``'s dtype. ``padded_heads``: heads the kernel runs (0 when it runs the model's own);
    ``slot_multiple``: the ``topk_slots`` width the kernel needs a multiple of.
    """

    name: str
    padded_heads: int
    slot_multiple: int

    def plan(self, sparse: SparseBuffers, meta: StepMetadata) -> Any: ...

    def forward(
        self,
        q: torch.Tensor,
        cache: MLAKVCache,
        layer: int,
        sparse: SparseBuffers,
        meta: StepMetadata,
        plan: Any,
        scale: float,
    ) -> torch.Tensor: ...

    def host_scalars(self) -> dict[str, Any]: ...


Available = Callable[[torch.device, str], bool]
#: name -> (available on (device, layout)?, factory(num_heads, layout)). Ordered by preference.
_REGISTRY: dict[str, tuple[Available, Callable[[int, str], SparseMLABackend]]] = {}


def register(name: str, available: Available):
    def wrap(factory: Callable[[int, str], SparseMLABackend]) -> Callable[[int, str], SparseMLABackend]:
        assert name not in _REGISTRY, f"sparse-MLA backend {name} registered twice"
        _REGISTRY[name] = (available, factory)
        return factory

    return wrap


def known_sparse_backends() -> list[str]:
    """Every registered sparse-MLA backend name, available here or not."""
    return list(_REGISTRY)


def available_sparse_backends(device: torch.device, layout: str) -> list[str]:
    names = [name for name, (ok, _) in _REGISTRY.items() if ok(device, layout)]
    return sorted(names, key=lambda n: n == "reference")  # NOTE: the oracle is the last resort


def select_sparse_backend(
    name: str | None, device: torch.device, layout: str, num_heads: int
) -> SparseMLABackend:
    """The named sparse-MLA backend, or the first available; errors list what is available."""
    usable = available_sparse_backends(device, layout)
    name = name or usable[0]
    if name not in _REGISTRY:
        raise ValueError(f"unknown sparse-MLA backend {name!r}; known: {', '.join(_REGISTRY)}")
    if name not in usable:
        raise ValueError(
            f"sparse-MLA backend {name!r} is not available on {device} with a {layout} KV cache; "
            f"available: {', '.join(usable)}"
        )
    return _REGISTRY[name][1](num_heads, layout)


def sparse_attention(
    q: torch.Tensor, kv: torch.Tensor, valid: torch.Tensor, scale: float, d_v: int = KV_LORA_RANK
) -> torch.Tensor:
    """Dense attention of each token over its selected keys, float32.

    ``q [T, H, D]``, ``kv [T, topk, D]`` (the selected latent rows), ``valid [T, topk]`` bool.
    Values are ``kv[..., :d_v]``. A token with no valid key gets zeros (as FlashMLA does).
    Returns ``[T, H, d_v]`` float32.
    """
    scores = torch.einsum("thd,tkd->thk", q.float(), kv) * scale
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    probs = torch.nan_to_num(scores.softmax(dim=-1), nan=0.0)
    # NOTE: zero invalid values too, so a NaN in a never-selected slot cannot leak as 0 * NaN.
    v = kv[..., :d_v].masked_fill(~valid[:, :, None], 0.0)
    return torch.einsum("thk,tkd->thd", probs, v)


class SparseMLAReference:
    """Gather the selected slots (dequantised for fp8), then :func:`sparse_attention`."""

    name = "reference"
    padded_heads = 0
    slot_multiple = 1

    def __init__(self, num_heads: int, layout: str) -> None:
        self.num_heads, self.layout = num_heads, layout

    def plan(self, sparse: SparseBuffers, meta: StepMetadata) -> None:
        return None

    def forward(
        self,
        q: torch.Tensor,
        cache: MLAKVCache,
        layer: int,
        sparse: SparseBuffers,
        meta: StepMetadata,
        plan: Any,
        scale: float,
    ) -> torch.Tensor:
        slots = sparse.topk_slots[: q.shape[0]]
        kv = cache.gather(layer, slots.long().clamp_min(0))
        return sparse_attention(q, kv, slots >= 0, scale).to(q.dtype)

    def host_scalars(self) -> dict[str, Any]:
        return {}


register("reference", lambda device, layout: True)(SparseMLAReference)

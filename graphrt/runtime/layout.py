"""A runtime's static buffer layout: which groups exist (the geometry), how large they are and
what their pad rows hold (the dummies)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from graphrt.buffers import Dims
from graphrt.kv import EncoderKV, PagedKVCache, ReqToToken
from graphrt.kv.window import WindowPool, window_step
from graphrt.metadata.buffer_groups import BufferGroups, Dummies
from graphrt.metadata.groups import Geometry
from graphrt.metadata.local import LocalGeometry, local_geometry
from graphrt.metadata.routing import RoutingShape
from graphrt.runtime.encoder import encoder_geometry
from graphrt.step.config import RuntimeConfig


@dataclass(frozen=True)
class Layout:
    """The allocated groups (``groups``) and what decided them."""

    groups: BufferGroups
    geometry: Geometry
    local: LocalGeometry | None
    window: WindowPool | None


def build_layout(
    config: RuntimeConfig,
    kv: PagedKVCache,
    req_to_token: ReqToToken,
    backend: Any,
    max_bs: int,
    encoder: EncoderKV | None,
    routing: RoutingShape | None = None,
) -> Layout:
    """Allocate every buffer group the runtime's steps use, for batches up to ``max_bs``
    (``routing``: a MoE model's experts and top-k, :func:`routing_shape`)."""
    # NOTE: token rows for the widest mode's largest bucket, or the largest MIXED token bucket;
    # every group sized by tokens (routing's expert alignment too) follows from this one value.
    tokens = max(max_bs * config.max_rows_per_req, config.max_tokens)
    dims = Dims(max_bs, tokens, config.max_pages, config.max_context_len)
    local, window = local_geometry(config), window_pool(kv, req_to_token, config)
    geometry = Geometry(
        config.speculative,
        local,
        config.sample,
        config.page_size,
        backend.buffers(),
        encoder=encoder_geometry(encoder, kv, req_to_token, config),
        window=window,
        routing=routing,
    )
    enc_page = None if encoder is None else encoder.kv.dummy_page
    dummies = Dummies(kv.dummy_slot, kv.dummy_page, req_to_token.dummy_req, enc_page)
    return Layout(BufferGroups(dims, kv.device, geometry, dummies), geometry, local, window)


def window_pool(kv: PagedKVCache, req_to_token: ReqToToken, config: RuntimeConfig) -> WindowPool | None:
    """The window-layer pool of ``kv`` (None without one), attached to ``req_to_token``.

    Raises ``ValueError`` for token trees (window layers refuse them) and for a pool sized for
    fewer positions per step than the captured modes write.
    """
    layers = getattr(kv, "window", None)
    if layers is None:
        return None
    spec = config.speculative
    if spec is not None and spec.topk > 1:
        raise ValueError(f"a window KV pool supports chains only: speculative topk {spec.topk} > 1")
    if layers.step < window_step(config):
        raise ValueError(
            f"the window pool was sized for {layers.step} position(s) per step, the captured modes "
            f"write up to {window_step(config)}: size it with window_step(config)"
        )
    full_slots = kv.shape.num_pages * kv.page_size
    pool = WindowPool(layers, full_slots, req_to_token.max_reqs, config.max_pages, kv.page_size, kv.device)
    req_to_token.window = pool
    return pool


def routing_shape(forward: Any) -> RoutingShape | None:
    """The routing a model's forward needs: its ``routing_shape()`` (the model, or the module
    of a bound ``forward``), None for a model without MoE layers."""
    owner = getattr(forward, "__self__", forward)
    shape = getattr(owner, "routing_shape", None)
    return shape() if callable(shape) else None

"""What a model's forward receives as ``ctx``, and the one typed object every context is built from.

:class:`ContextInputs` gathers one step's attention inputs (metadata, cache, backend, request
table, the kind's own buffers, the chunked-local virtual batch, the scalar log); an attention
kind turns it into the context its models call: :class:`ForwardContext` for MHA/GQA here,
:class:`~graphrt.attention.sparse_context.SparseMLAContext` for DSA.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from graphrt.attention.base import AttentionBackend
from graphrt.attention.call import AttendCall, FreshKV
from graphrt.attention.store import rotate_and_store
from graphrt.kv import EncoderKV, PagedKVCache, ReqToToken
from graphrt.metadata.base import StepMetadata
from graphrt.metadata.encoder import EncoderBuffers
from graphrt.metadata.local import LocalBuffers
from graphrt.metadata.window import WindowBuffers
from graphrt.step.modes import ForwardMode

#: The plan of a context whose backend has not planned yet (None is a valid plan).
_UNPLANNED = object()


class ScalarLog:
    """Per-layer kernel scalars a model passes (window, chunk): model constants.

    The runtime records them at capture with the graph's host scalars (rule 4 of docs/architecture.md).
    """

    def __init__(self) -> None:
        self._values: dict[str, Any] = {}

    def record(self, key: str, value: Any) -> None:
        self._values[key] = value

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)


@dataclass(frozen=True, slots=True)
class LocalStep:
    """The chunked-local virtual batch of one step: what local layers attend with."""

    chunk_size: int
    meta: StepMetadata

    @classmethod
    def bind(cls, meta: StepMetadata, local: LocalBuffers, chunk_size: int) -> LocalStep:
        """``meta``'s fields with the virtual batch's buffers (one query token per request)."""
        # NOTE: mode DECODE and no cascade: every virtual request is one query token, so the
        # backends take their plain decode path.
        local_meta = dataclasses.replace(
            meta, mode=ForwardMode.DECODE, buffers=local, max_seqlen_q=1, cascade=None
        )
        return cls(chunk_size, local_meta)

    def metadata(self, layer_id: int, chunk: int) -> StepMetadata:
        if chunk != self.chunk_size:
            raise ValueError(
                f"layer {layer_id} uses attention_chunk_size {chunk}, but the runtime's local "
                f"buffers were built for {self.chunk_size}"
            )
        return self.meta


@dataclass(frozen=True, slots=True)
class WindowStep:
    """What window-pool layers attend with: the step's metadata with the window slots and page
    table (:mod:`graphrt.metadata.window`); ``size``: the pool's window."""

    size: int
    meta: StepMetadata

    @classmethod
    def bind(cls, meta: StepMetadata, window: WindowBuffers, size: int, column: int = 0) -> WindowStep:
        """``meta`` with ``window``'s page table and its slots of column ``column`` (draft step)."""
        buffers = dataclasses.replace(
            meta.buffers, out_cache_loc=window.out_cache_loc[:, column], page_table=window.page_table
        )
        return cls(size, dataclasses.replace(meta, buffers=buffers))

    def metadata(self, layer_id: int, window: int | None) -> StepMetadata:
        if window is None or window > self.size:
            raise ValueError(
                f"layer {layer_id} keeps its KV in the window pool (window {self.size}) but attends "
                f"with window {window}: a pooled layer needs a window of at most {self.size}"
            )
        return self.meta


def window_metadata(step: WindowStep | None, layer_id: int, window: int | None) -> StepMetadata:
    """The metadata a window-pool layer stores and attends with; a clear error without one."""
    if step is None:
        raise ValueError(
            f"layer {layer_id} keeps its KV in a window pool, but the step has no window buffers"
        )
    return step.metadata(layer_id, window)


def local_metadata(local: LocalStep | None, layer_id: int, chunk: int) -> StepMetadata:
    """The virtual batch a chunked layer attends with; a clear error without local buffers."""
    if local is None:
        raise ValueError(
            f"layer {layer_id} uses chunked-local attention (attention_chunk_size {chunk}) but the "
            f"runtime has no local buffers: set RuntimeConfig.attention_chunk_size={chunk}"
        )
    return local.metadata(layer_id, chunk)


@dataclass(frozen=True, slots=True)
class CrossStep:
    """What cross-attention layers read in one step: the encoder cache and this step's
    encoder page table and lengths (:mod:`graphrt.metadata.encoder`)."""

    kv: EncoderKV
    buffers: EncoderBuffers


@dataclass(frozen=True, slots=True)
class ContextInputs:
    """One step's attention inputs; an attention kind builds its ``ctx`` from these.

    ``kv``: the kind's cache; ``backend``: the kind's backend; ``group``: the view of the
    backend's own buffer group, if it has one; ``local``: the chunked-local virtual batch;
    ``cross``: an encoder-decoder model's encoder cache and buffers.
    """

    meta: StepMetadata
    kv: Any
    backend: Any
    req_to_token: ReqToToken
    scalars: ScalarLog
    group: Any = None
    local: LocalStep | None = None
    cross: CrossStep | None = None
    window: WindowStep | None = None
    #: The model's own inputs (:class:`ModelInputs`).
    routing: Any = None
    routing_tokens: torch.Tensor | None = None
    head_rows: torch.Tensor | None = None


class ModelInputs:
    """What a model's forward reads from its ``ctx`` besides attention, set by
    :func:`attach_model_inputs`: a MoE model's ``routing`` buffers for the forward's token rows
    (the kernels' ``Routing``) and ``routing_tokens [1]`` int32, its real rows (rows past it are
    pad rows); ``head_rows [R]`` int64, the rows the head computes (each request's last on a
    sampling step of a ragged mode: ``ModeSpec.last_rows_only``; None: every row)."""

    routing: Any = None
    routing_tokens: torch.Tensor | None = None
    head_rows: torch.Tensor | None = None


def attach_model_inputs(ctx: Any, inputs: ContextInputs) -> Any:
    """``ctx`` with the :class:`ModelInputs` of ``inputs`` (routing: :mod:`graphrt.metadata.routing`)."""
    ctx.routing, ctx.routing_tokens, ctx.head_rows = inputs.routing, inputs.routing_tokens, inputs.head_rows
    return ctx


class ForwardContext(ModelInputs):
    """Per-step handle passed as ``ctx`` to ``forward(input_ids, positions, ctx)`` (MHA/GQA).

    ``local``: the step's chunked-local virtual batch, when the runtime has one.
    ``window``: what the cache's window-pool layers store and attend with, when it has any.
    ``scalars``: where per-layer kernel scalars (window, chunk) are recorded.
    ``group``: the backend's own buffer group (its view for this step), if any; the backend's
    ``plan`` runs on it at the first :meth:`attention` call, once per forward. ``cross``: the
    encoder cache and buffers :meth:`cross_attention` reads (encoder-decoder models).
    The model's own inputs: :class:`ModelInputs`.
    """

    def __init__(
        self,
        meta: StepMetadata,
        kv: PagedKVCache,
        backend: AttentionBackend,
        local: LocalStep | None = None,
        scalars: ScalarLog | None = None,
        group: Any = None,
        cross: CrossStep | None = None,
        window: WindowStep | None = None,
    ) -> None:
        self.meta, self.kv, self.backend, self.local, self.group = meta, kv, backend, local, group
        self.cross, self.window = cross, window
        self.scalars = ScalarLog() if scalars is None else scalars
        self._plan: Any = _UNPLANNED

    @classmethod
    def from_inputs(cls, inputs: ContextInputs) -> ForwardContext:
        """The MHA/GQA context of one step's :class:`ContextInputs`."""
        i = inputs
        return attach_model_inputs(
            cls(i.meta, i.kv, i.backend, i.local, i.scalars, i.group, i.cross, i.window), i
        )

    @property
    def mode(self) -> ForwardMode:
        """The step's :class:`~graphrt.step.ForwardMode`."""
        return self.meta.mode

    def attention(
        self,
        layer_id: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        window: int | None = None,
        chunk: int | None = None,
        rope: torch.Tensor | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Store ``k``/``v`` at ``out_cache_loc``, then attend.

        ``q [num_tokens, num_q_heads, head_dim]``, ``k``/``v [num_tokens, num_kv_heads,
        head_dim]``; returns ``[num_tokens, num_q_heads, head_dim]``. ``window``: a query at
        position ``p`` sees keys ``p - window … p`` (sliding window); ``chunk``: it sees keys
        from ``p - p % chunk`` on (chunked-local attention). Both are fixed per layer.
        ``rope``: this step's ``cos_sin [num_tokens, head_dim]`` when ``q`` and ``k`` are not
        rotated yet; they are rotated (NeoX halves) as ``k`` is stored: by ``rope_store`` (one
        kernel on GPU) or the attention kernel (:mod:`graphrt.attention.store`). ``q``/``k``/``v``
        may be views of the qkv projection either way. ``sinks [num_q_heads]``: the layer's
        learned sink logits (a weight), added to each softmax's denominator. An FP8 cache
        quantises ``k``/``v`` as it stores them and the backend reads it with the layer's
        scales. A window-pool layer stores at its window slots and reads its window page table.
        """
        meta = self.meta
        if layer_id in getattr(self.kv, "window_layers", ()):
            meta = window_metadata(self.window, layer_id, window)
        loc, kv_scales = meta.buffers.out_cache_loc, self.kv.scales(layer_id)
        k_cache, v_cache = self.kv.k[layer_id], self.kv.v[layer_id]
        attend_meta = self._attend_metadata(layer_id, meta, window, chunk, sinks)
        scale = q.shape[-1] ** -0.5
        call = AttendCall(q, k_cache, v_cache, attend_meta, scale, window, sinks=sinks, kv_scales=kv_scales)
        if rope is None:
            self.kv.store(layer_id, loc, k, v)
        else:
            call = rotate_and_store(self.backend, call, FreshKV(k, v, rope, loc), own_rows=chunk is None)
        if self._plan is _UNPLANNED:
            # NOTE: once per forward, before the first layer attends: every layer reads it.
            planned = dataclasses.replace(call, meta=self.meta, group=self.group, fresh=None)
            self._plan = self.backend.plan(planned)
        plan = None if chunk is not None else self._plan  # NOTE: local layers: planned for the step
        return self.backend.forward(dataclasses.replace(call, plan=plan))

    def _attend_metadata(
        self, layer_id: int, meta: StepMetadata, window: int | None, chunk: int | None, sinks: Any
    ) -> StepMetadata:
        """What layer ``layer_id`` attends with: ``meta``, or the chunked-local virtual batch;
        checks the window and sinks against the backend's declared support and records the
        layer's kernel scalars (before anything is stored)."""
        support = self.backend.graph_support
        for option, declared, what in (
            (window, support.window, "sliding window"),
            (sinks, support.sinks, "sinks"),
        ):
            if option is not None and not declared:
                raise ValueError(
                    f"layer {layer_id} attends with {what}, which attention backend "
                    f"{self.backend.name!r} does not declare: pick another backend"
                )
        if window is not None:
            if self.meta.cascade is not None:
                raise ValueError(
                    f"layer {layer_id}: sliding window {window} with a token tree (topk > 1) is not supported"
                )
            self.scalars.record(f"layer{layer_id}.window", window)
        if chunk is None:
            return meta
        local = local_metadata(self.local, layer_id, chunk)
        self.scalars.record(f"layer{layer_id}.chunk", chunk)
        self.scalars.record("local.max_seqlen_q", local.max_seqlen_q)
        return local

    def cross_attention(self, layer_id: int, q: torch.Tensor) -> torch.Tensor:
        """Attend ``q [num_tokens, num_q_heads, head_dim]`` to its request's encoder K/V.

        ``layer_id``: the cross layer's index in the encoder cache. Non-causal over the
        request's encoder output (written once per request, :class:`~graphrt.kv.EncoderKV`);
        returns ``[num_tokens, num_q_heads, head_dim]``.
        """
        cross = self.cross
        if cross is None:
            raise ValueError(
                f"cross layer {layer_id} reads an encoder cache, but the runtime has none: "
                "build it with GraphRuntime(..., encoder=EncoderKV(...)) (build_stack does)"
            )
        kv = cross.kv.kv
        call = AttendCall(
            q, kv.k[layer_id], kv.v[layer_id], self.meta, q.shape[-1] ** -0.5, kv_scales=kv.scales(layer_id)
        )
        return self.backend.cross(call, cross.buffers)

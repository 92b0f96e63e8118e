"""The attention-backend contract, one for MHA/GQA, dense MLA and sparse MLA: one file per
backend, one row in the registry.

A backend owns everything its kernels need beyond the step's shared metadata:

- ``graph_support``: what it serves (:class:`~graphrt.attention.capabilities.GraphSupport`,
  opt-in: modes, trees, window, sinks, FP8 KV, ``qv``, cross, chunked-local), checked when the
  runtime is built;
- ``buffers()``: its own per-step buffer group (specs + the dataclass naming them), allocated
  once with the other groups and viewed per bucket; ``None`` when it needs none;
- ``write_host(batch, host, rows)``: the host half of that group's update, when it has
  host-written buffers (its ``BufferGroup.write``; copied to the device with the others);
- ``plan(call)``: in-graph work run once per forward, on the first layer's
  :class:`~graphrt.attention.call.AttendCall` (e.g. FA3's scheduler metadata); its result reaches
  every layer's call as ``call.plan``;
- ``forward(call)``: the layer's attention;
- ``takes(call)``: whether it takes this step, as a part of a dispatch row
  (:mod:`graphrt.attention.dispatch`), and ``yields(call)``: whether, as a dispatch's last part,
  it lets the parts before it take the step;
- ``fuses_store(call)``: whether its ``forward`` rotates the query and stores the step's new keys
  itself (``call.fresh``: :class:`~graphrt.attention.call.FreshKV`), in place of the context's
  ``rope_store``; a backend that says no never gets a call with ``fresh``;
- ``cross(call, encoder)``: non-causal attention over each request's encoder K/V.

Selection lives in :mod:`graphrt.attention.registry`.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import torch

from graphrt.attention.call import AttendCall
from graphrt.attention.capabilities import GraphSupport
from graphrt.metadata.groups import BufferGroup
from graphrt.step.batch import Batch


class AttentionBackend(Protocol):
    """Paged attention over the KV cache for one layer.

    ``forward(call)`` returns ``[num_tokens, num_q_heads, head_dim_v]`` in ``call.q``'s dtype.
    Query token ``i`` of request ``b`` sits at position ``cache_seqlens[b] - q_len_b + i`` and
    attends causally (a token tree: its prefix and ancestors, ``meta.cascade``); the options of
    :class:`~graphrt.attention.call.AttendCall` apply as declared in ``graph_support``. An FP8
    cache's query is rounded to FP8 as the kernel reads it (:mod:`graphrt.kv.quant`); a token
    tree's cascade counts the sink once, in its prefix half.
    """

    name: str
    graph_support: GraphSupport

    def buffers(self) -> BufferGroup | None: ...

    def write_host(self, batch: Batch, host: dict[str, np.ndarray], rows: int) -> None: ...

    def plan(self, call: AttendCall) -> Any: ...

    def takes(self, call: AttendCall) -> bool: ...

    def yields(self, call: AttendCall) -> bool: ...

    def fuses_store(self, call: AttendCall) -> bool: ...

    def forward(self, call: AttendCall) -> torch.Tensor: ...

    def host_scalars(self) -> dict[str, Any]:
        """Python values this backend hands to its kernels beyond the metadata's."""
        ...

    def cross(self, call: AttendCall, encoder: Any) -> torch.Tensor:
        """Cross-attention: ``call.q`` (packed by ``meta.buffers.cu_seqlens_q``) attends,
        non-causally, every key of its request's encoder output: ``encoder.encoder_page_table
        [bs, pages]`` (page ids into ``call.k_cache`` / ``call.v_cache``, the encoder cache's
        layer) and ``encoder.encoder_lens [bs]``. Returns ``[num_tokens, num_q_heads, head_dim]``
        in ``q``'s dtype."""
        ...


class Backend:
    """Defaults for the hooks a backend does not need: no buffers, no host write, no plan,
    takes every step, no host scalars, no fused store, no cross-attention, and serves nothing
    until ``graph_support`` says what. Subclass and override what the kernels need."""

    name = "backend"
    graph_support = GraphSupport()

    @classmethod
    def available(cls, device: torch.device, **need: Any) -> bool:
        """Whether it runs on ``device`` for ``need`` (the kind's build arguments)."""
        return True

    def buffers(self) -> BufferGroup | None:
        return None

    def write_host(self, batch: Batch, host: dict[str, np.ndarray], rows: int) -> None:
        return None

    def plan(self, call: AttendCall) -> Any:
        """No plan."""
        return None

    def takes(self, call: AttendCall) -> bool:
        """Every step it is given."""
        return True

    def yields(self, call: AttendCall) -> bool:
        """No step to a dispatch's earlier parts."""
        return False

    def fuses_store(self, call: AttendCall) -> bool:
        """No fused store: the context stores the new keys before :meth:`forward`."""
        return False

    def forward(self, call: AttendCall) -> torch.Tensor:
        raise NotImplementedError(f"attention backend {self.name!r} has no forward")

    def host_scalars(self) -> dict[str, Any]:
        return {}

    def cross(self, call: AttendCall, encoder: Any) -> torch.Tensor:
        """No cross-attention (see :meth:`AttentionBackend.cross`)."""
        raise ValueError(
            f"attention backend {self.name!r} has no cross-attention (encoder-decoder models): "
            "use 'fa3' or 'reference'"
        )

"""The split decode kernel as an attention backend (needs Triton only, not FA3).

It takes the single-token decode steps and the speculative verify chains the kernel fits
(:func:`~graphrt.attention.split_decode.attend.takes`: one query token per request, or a chain of
them as one row each; sliding window and sinks or not, no FP8 scales nor ``qv``, 16-bit
tensors); every other step runs the torch reference, so on its own row it serves what the
reference serves. In the ``fa3`` row it is the first part of a dispatch: FA3 yields it the steps
whose CTAs would leave the GPU short (:meth:`graphrt.attention.fa3.FA3Backend.yields`). On the
CPU it runs under Triton's interpreter (``TRITON_INTERPRET=1`` and
``GRAPHRT_DECODE_ATTENTION=interpret``).

It ``fuses_store``: for a single-token step it takes whose layer hands its q and k unrotated
(``rope=``), the context leaves RoPE and the KV store to the kernel (``call.fresh``) instead of
running :func:`~graphrt.kv.rope_store.rope_store` first: one launch a layer fewer. A verify
chain's rows read each other's new keys, so ``rope_store`` stores them before the kernel runs.
"""

from __future__ import annotations

from typing import Any

import torch

from graphrt.attention.call import AttendCall
from graphrt.attention.reference import ReferenceBackend
from graphrt.attention.split_decode import attend as kernel


class SplitDecodeBackend(ReferenceBackend):
    """The kernel for the steps it takes, the torch reference for the rest."""

    name = "split_decode"

    @classmethod
    def available(cls, device: torch.device, dtype: torch.dtype | None = None, **_: Any) -> bool:
        """Triton runs the kernel on ``device`` (:func:`kernel.enabled`); a cache the kernel does
        not read (FP8) takes the reference on every step, as this row's support says."""
        return kernel.enabled(device)

    def takes(self, call: AttendCall) -> bool:
        return kernel.takes(call.q, call.k_cache, call.meta, *call.options())

    def fuses_store(self, call: AttendCall) -> bool:
        """A step it takes, with the new keys given (``call.fresh``), where the kernel can rotate
        and store them (:func:`kernel.fuses_store`)."""
        fresh = call.fresh
        return (
            fresh is not None
            and self.takes(call)
            and kernel.fuses_store(call.q, call.k_cache, call.v_cache, fresh, call.meta)
        )

    def forward(self, call: AttendCall) -> torch.Tensor:
        if self.takes(call):
            q, k, v, meta = call.q, call.k_cache, call.v_cache, call.meta
            return kernel.attend(q, k, v, meta, call.scale, call.window, call.sinks, call.fresh)
        if call.fresh is not None:
            raise ValueError("split_decode: a call with new keys to store is one it fuses_store only")
        return super().forward(call)

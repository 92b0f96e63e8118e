"""The dense-MLA split decode kernel as an attention backend (needs Triton only, not FA3).

It takes the single-token MLA decode steps the kernel fits
(:func:`~graphrt.attention.split_decode.mla_attend.takes`: one query token per request with
``qv``, no window, sinks, FP8 scales nor token tree, 16-bit tensors of DeepSeek's widths); every
other step runs the torch reference, so on its own row it serves what the reference serves. In
the ``mla`` table's ``fa3`` row it is the first part of a dispatch: FA3-MLA yields it the decode
steps whose CTAs would leave the GPU short (:meth:`graphrt.attention.fa3.FA3Backend.yields`,
with one KV head). On the CPU it runs under Triton's interpreter (``TRITON_INTERPRET=1`` and
``GRAPHRT_DECODE_ATTENTION=interpret``).
"""

from __future__ import annotations

from typing import Any

import torch

from graphrt.attention.call import AttendCall
from graphrt.attention.reference import ReferenceBackend
from graphrt.attention.split_decode import mla_attend as kernel


class MLASplitDecodeBackend(ReferenceBackend):
    """The kernel for the steps it takes, the torch reference for the rest."""

    name = "mla_split_decode"

    @classmethod
    def available(
        cls,
        device: torch.device,
        dtype: torch.dtype | None = None,
        rope_dim: int = kernel.ROPE_DIM,
        kv_lora_rank: int = kernel.LATENT_DIM,
        **_: Any,
    ) -> bool:
        """Triton runs the kernel on ``device`` for a 16-bit cache (``dtype``; None: any) of the
        kernel's widths: a cache it never reads (FP8, fp32, other widths) is left to the rows
        that do."""
        widths = (rope_dim, kv_lora_rank) == (kernel.ROPE_DIM, kernel.LATENT_DIM)
        return widths and (dtype is None or dtype in kernel.DTYPES) and kernel.enabled(device)

    def takes(self, call: AttendCall) -> bool:
        return kernel.takes(call.q, call.k_cache, call.v_cache, call.meta, *call.options())

    def forward(self, call: AttendCall) -> torch.Tensor:
        if self.takes(call):
            assert call.qv is not None  # NOTE: takes() checked it
            return kernel.attend(call.q, call.qv, call.k_cache, call.v_cache, call.meta, call.scale)
        return super().forward(call)

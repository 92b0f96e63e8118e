"""Dense MLA through FA3: ``flash_attn_with_kvcache(q=q_rope, k_cache=rope, v_cache=latent, qv=...)``.

The absorbed form of DeepSeek-V2/V3 attention is MQA over one shared KV head: each query
head scores ``q_rope . k_rope + qv . latent`` (``qv = q_nope W_UK``) and reads the latent
as its value. FA3 runs exactly that with ``qv`` on Hopper for head dim 64 and value head dim
512 (``q_v is only supported for head_size <= 64`` / ``hdim_v >= 256`` / ``Hopper GPUs``;
SGLang's FA3 backend calls it the same way). Everything else is :class:`FA3Backend`'s:
its scheduler-metadata plan (planned with ``headdim_v``), token-tree cascade + ``merge_state_v2``,
and graph support for every mode.
"""

from __future__ import annotations

from typing import Any

import torch

from graphrt.attention.call import AttendCall
from graphrt.attention.capabilities import ALL_MODES, GraphSupport
from graphrt.attention.fa3 import FA3Backend, fa3_available

#: The MLA shape FA3's ``qv`` kernel is built for: RoPE key width and latent (value) width.
FA3_ROPE_DIM, FA3_LATENT_DIM = 64, 512


class FA3MLABackend(FA3Backend):
    """FA3 for the dense-MLA kind: ``forward(q_rope, rope_cache, latent_cache, ..., qv=qv)``."""

    name = "fa3"
    # NOTE: MLA layers have neither windows, sinks, an encoder nor chunked-local layers; MIXED
    # is FA3's varlen call with qv, as EXTEND's (tests/runtime/test_mixed_mode.py, on the GPU).
    graph_support = GraphSupport(ALL_MODES, trees=True, fp8_kv=True, qv=True)

    def __init__(self, dtype: torch.dtype | None = None, **_: Any) -> None:
        super().__init__(dtype)

    @classmethod
    def available(
        cls,
        device: torch.device,
        dtype: torch.dtype | None = None,
        rope_dim: int = FA3_ROPE_DIM,
        kv_lora_rank: int = FA3_LATENT_DIM,
        **_: Any,
    ) -> bool:
        if (rope_dim, kv_lora_rank) != (FA3_ROPE_DIM, FA3_LATENT_DIM) or not fa3_available(device, dtype):
            return False
        # NOTE: FA3's qv path is Hopper-only; is_fa3_supported also admits sm8x.
        return torch.cuda.get_device_capability(device)[0] == 9

    def plan(self, call: AttendCall) -> torch.Tensor | None:
        """FA3's schedule for ``q = q_rope`` over ``k_cache`` (RoPE keys) with ``v_cache``
        (latents) as values: planned with ``headdim_v`` = the latent width."""
        return self.schedule(call, call.v_cache.shape[-1])

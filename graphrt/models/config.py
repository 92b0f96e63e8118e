"""The config of a decoder loaded from a checkpoint (what :class:`~graphrt.models.CausalLM` reads)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from graphrt.models.moe_config import MoESpec


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """A loaded decoder's shape and features (the field names :class:`Decoder` reads)."""

    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_eps: float
    rope_theta: float
    rope_type: str = "default"
    rope_params: Mapping[str, Any] = field(default_factory=dict)
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    #: RMSNorm over the whole q and k projections before RoPE (OLMoE).
    qk_norm_full: bool = False
    #: Learned attention sinks per query head (gpt-oss).
    sinks: bool = False
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 2048
    #: Per layer: graphrt's window (a query at ``p`` sees ``p - w … p``) or ``None`` (full).
    windows: tuple[int | None, ...] = ()
    #: Mixture-of-experts MLPs (None: every MLP dense).
    moe: MoESpec | None = None

    def window(self, layer_id: int) -> int | None:
        return self.windows[layer_id] if self.windows else None

    def chunk(self, layer_id: int) -> int | None:
        return None

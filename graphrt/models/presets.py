"""Built-in model presets: random weights from a seed, nothing downloaded."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6


PRESETS: dict[str, LlamaConfig] = {
    "tiny-llama": LlamaConfig(
        vocab_size=512,
        hidden_size=256,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        intermediate_size=512,
    ),
    "tiny-llama-draft": LlamaConfig(
        vocab_size=512,
        hidden_size=256,
        num_layers=1,
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        intermediate_size=512,
    ),
}


def preset(name: str) -> LlamaConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown model {name!r}; presets: {', '.join(PRESETS)}")
    return PRESETS[name]

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


@dataclass(frozen=True, slots=True)
class DSAConfig:
    """A DeepSeek-V3.2-style (MLA + DSA indexer) decoder; the latent is FlashMLA's 512 + 64."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    qk_nope_dim: int
    v_head_dim: int
    index_heads: int
    index_dim: int
    index_topk: int
    intermediate_size: int
    kv_lora_rank: int = 512
    qk_rope_dim: int = 64
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6


def _tiny_dsa(index_topk: int, num_heads: int = 4) -> DSAConfig:
    return DSAConfig(
        vocab_size=512,
        hidden_size=256,
        num_layers=2,
        num_heads=num_heads,
        qk_nope_dim=64,
        v_head_dim=64,
        index_heads=2,
        index_dim=32,
        index_topk=index_topk,
        intermediate_size=512,
    )


PRESETS: dict[str, LlamaConfig | DSAConfig] = {
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
    "tiny-dsa": _tiny_dsa(index_topk=64),
    "tiny-dsa-2k": _tiny_dsa(index_topk=2048),
}


def preset(name: str) -> LlamaConfig | DSAConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown model {name!r}; presets: {', '.join(PRESETS)}")
    return PRESETS[name]

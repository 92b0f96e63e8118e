"""Built-in model presets: random weights from a seed, nothing downloaded."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from graphrt.models.indexer import IndexerSpec
from graphrt.models.moe_config import MoESpec
from graphrt.models.rope import mla_softmax_mscale


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
    #: Local layers see keys ``p - sliding_window … p`` (FA3 ``window_size=(w, 0)``).
    sliding_window: int | None = None
    #: Local layers attend within aligned chunks of this many positions (Llama-4).
    attention_chunk_size: int | None = None
    #: Layer ``i`` is global when ``(i + 1) % global_every == 0``; the others are local
    #: (Llama-4: 4; Gemma-2's alternation: 2). Without a window or chunk every layer is global.
    global_every: int = 4
    #: The LM head is the embedding table (one ``[vocab, hidden]`` tensor read by both).
    tie_word_embeddings: bool = False
    #: Every layer has learned attention sinks: one logit per query head that joins the
    #: softmax's denominator (gpt-oss).
    sinks: bool = False
    #: Mixture-of-experts MLPs (None: every MLP dense).
    moe: MoESpec | None = None

    def __post_init__(self) -> None:
        for name in ("sliding_window", "attention_chunk_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 (or None), got {value}")
        if self.sliding_window is not None and self.attention_chunk_size is not None:
            raise ValueError(
                f"a model uses sliding_window ({self.sliding_window}) or attention_chunk_size "
                f"({self.attention_chunk_size}), not both"
            )
        if self.global_every < 1:
            raise ValueError(f"global_every must be >= 1, got {self.global_every}")

    def is_local(self, layer_id: int) -> bool:
        """Whether layer ``layer_id`` uses the sliding window or chunked-local attention."""
        return (layer_id + 1) % self.global_every != 0

    def window(self, layer_id: int) -> int | None:
        return self.sliding_window if self.is_local(layer_id) else None

    def chunk(self, layer_id: int) -> int | None:
        return self.attention_chunk_size if self.is_local(layer_id) else None


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


@dataclass(frozen=True, slots=True)
class MLAConfig:
    """A DeepSeek-V2/V3-style dense decoder: multi-head latent attention, SwiGLU MLPs.

    Field names follow transformers' ``DeepseekV3Config``. ``q_lora_rank`` None: one ``q_proj``
    (DeepSeek-V2-Lite), else ``q_a_proj`` → RMSNorm → ``q_b_proj``. ``rope_interleave``: the
    RoPE dims of q and k are rotated in interleaved pairs (DeepSeek's layout), else NeoX halves.
    The cache holds ``kv_lora_rank + qk_rope_head_dim`` values per token and layer.
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    intermediate_size: int
    q_lora_rank: int | None = None
    rope_theta: float = 10000.0
    rope_type: str = "default"
    rope_params: Mapping[str, Any] = field(default_factory=dict)
    rms_eps: float = 1e-6
    rope_interleave: bool = True
    attention_bias: bool = False
    tie_word_embeddings: bool = False
    architecture: str = "DeepseekV3ForCausalLM"
    max_position_embeddings: int = 2048
    #: Mixture-of-experts MLPs (None: every MLP dense).
    moe: MoESpec | None = None
    #: DeepSeek-V3.2's DSA indexer (None: dense MLA); with it the attention is sparse MLA.
    indexer: IndexerSpec | None = None

    @property
    def softmax_scale(self) -> float:
        """``1 / sqrt(qk_nope_head_dim + qk_rope_head_dim)``, times YaRN's
        ``mscale(factor, mscale_all_dim) ** 2`` when the rope is scaled (:func:`mla_softmax_mscale`)."""
        base = (self.qk_nope_head_dim + self.qk_rope_head_dim) ** -0.5
        return base * mla_softmax_mscale(self.rope_type, self.rope_params)


@dataclass(frozen=True, slots=True)
class CrossConfig:
    """An encoder-decoder model: a small non-causal encoder over encoder token ids, and a Llama-style
    decoder whose layers alternate self-attention (odd ``layer_id``: cross-attention instead).

    The encoder embeds ``encoder_ids`` (``encoder_vocab_size``) with learned absolute positions
    (up to ``max_encoder_len``), runs ``encoder_layers`` bidirectional pre-norm blocks and a final
    norm; each cross layer projects that output to its own K/V once per request. Every layer
    has a SwiGLU MLP; attention shapes (heads, KV heads, head dim) are shared by both kinds.
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    encoder_layers: int = 2
    encoder_vocab_size: int = 512
    max_encoder_len: int = 64
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6

    def is_cross(self, layer_id: int) -> bool:
        """Whether decoder layer ``layer_id`` is a cross-attention layer (odd ids)."""
        return layer_id % 2 == 1

    @property
    def self_layers(self) -> int:
        """Decoder layers with self-attention: the decoder KV cache's layers."""
        return sum(not self.is_cross(i) for i in range(self.num_layers))

    @property
    def cross_layers(self) -> int:
        """Decoder layers with cross-attention: the encoder KV cache's layers."""
        return self.num_layers - self.self_layers

    def window(self, layer_id: int) -> None:
        return None  # NOTE: the self-attention layers (llama.Attention) ask; all are global

    def chunk(self, layer_id: int) -> None:
        return None


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


_TINY = LlamaConfig(
    vocab_size=512,
    hidden_size=256,
    num_layers=4,
    num_heads=4,
    num_kv_heads=2,
    head_dim=64,
    intermediate_size=512,
)

PRESETS: dict[str, LlamaConfig | DSAConfig | MLAConfig | CrossConfig] = {
    "tiny-llama": _TINY,
    # NOTE: the tiny target cut to one layer, so a draft can share its weights by name
    "tiny-llama-draft": replace(_TINY, num_layers=1),
    # NOTE: Llama-3-8B's shapes (random weights: for benchmarks, never for text).
    "llama-3-8b": LlamaConfig(
        vocab_size=128256,
        hidden_size=4096,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=14336,
        rope_theta=500000.0,
        rms_eps=1e-5,
    ),
    # NOTE: DeepSeek's latent and RoPE widths (512 + 64: FA3's MLA shape) on a tiny decoder.
    "tiny-mla": MLAConfig(
        vocab_size=512,
        hidden_size=256,
        num_layers=2,
        num_heads=4,
        q_lora_rank=128,
        kv_lora_rank=512,
        qk_nope_head_dim=64,
        qk_rope_head_dim=64,
        v_head_dim=64,
        intermediate_size=512,
    ),
    "tiny-dsa": _tiny_dsa(index_topk=64),
    "tiny-dsa-2k": _tiny_dsa(index_topk=2048),
}
# NOTE: Llama-3.2-1B: Llama-3-8B's vocabulary, heads and RoPE theta at half the width and depth,
# head_dim 64, intermediate 8192, the head tied to the embedding (random weights; default RoPE,
# not the checkpoint's llama3 scaling: same kernels, same bytes). A step reads 2.47 GB of
# weights, 525 MB of them the head's: the decode-at-the-floor target.
PRESETS["llama-3.2-1b"] = replace(
    PRESETS["llama-3-8b"],
    hidden_size=2048,
    num_layers=16,
    head_dim=64,
    intermediate_size=8192,
    tie_word_embeddings=True,
)
# NOTE: same sizes as tiny-llama. The window (24) is not a multiple of 16, so its edge falls
# inside a page; the chunk (32) spans two 16-token pages.
PRESETS["tiny-llama-swa"] = replace(PRESETS["tiny-llama"], sliding_window=24, global_every=2)
PRESETS["tiny-llama-local"] = replace(PRESETS["tiny-llama"], attention_chunk_size=32, global_every=4)
# NOTE: gpt-oss's attention with a dense MLP: sliding-window layers (0, 2) alternate with full
# ones (1, 3), and every layer has sinks.
PRESETS["tiny-sinks"] = replace(PRESETS["tiny-llama"], sliding_window=24, global_every=2, sinks=True)


# NOTE: tiny-llama's decoder shapes; layers 0, 2 self-attention, 1, 3 cross-attention.
PRESETS["tiny-cross"] = CrossConfig(
    vocab_size=512,
    hidden_size=256,
    num_layers=4,
    num_heads=4,
    num_kv_heads=2,
    head_dim=64,
    intermediate_size=512,
)


# NOTE: imported here, below the config classes it builds on (it imports this module).
from graphrt.models.moe_presets import moe_presets  # noqa: E402

PRESETS |= moe_presets(PRESETS["tiny-llama"], PRESETS["tiny-sinks"], PRESETS["tiny-mla"])


def preset(name: str) -> LlamaConfig | DSAConfig | MLAConfig | CrossConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown model {name!r}; presets: {', '.join(PRESETS)}")
    return PRESETS[name]

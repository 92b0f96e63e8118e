"""Mixture-of-experts presets: the real shapes of served MoE models and tiny ones for tests.

Random weights from a seed (for benchmarks and tests, never for text). The real shapes keep
what decides a step's bytes and launches (layers, heads, experts, top-k, expert and shared
sizes, dense layers); details that move few bytes are left out and said per preset.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from graphrt.models.indexer import IndexerSpec
from graphrt.models.moe_config import MoESpec, deepseek_sparse, qwen_sparse

#: gpt-oss's router and experts: top-k of biased logits then softmax; clamped SwiGLU with biases.
GPT_OSS: dict[str, Any] = dict(
    scoring="topk_softmax", router_bias=True, activation="swiglu_clamp", expert_bias=True
)
#: DeepSeek-V3's router: sigmoid scores, the correction bias, 4 groups keep 2, renorm, x2.5.
V3_ROUTER: dict[str, Any] = dict(
    scoring="sigmoid",
    norm_topk_prob=True,
    n_group=4,
    topk_group=2,
    routed_scaling_factor=2.5,
    score_bias=True,
    router_fp32=True,
)

#: Real shapes: name → (base tiny preset, fields replaced).
REAL: dict[str, tuple[str, dict[str, Any]]] = {
    # NOTE: Qwen3-30B-A3B: 48 layers of 128 experts (8 per token, 768 wide); no q/k norm here.
    "qwen3-30b-a3b": (
        "tiny",
        dict(
            vocab_size=151936,
            hidden_size=2048,
            num_layers=48,
            num_heads=32,
            num_kv_heads=4,
            head_dim=128,
            intermediate_size=6144,
            rope_theta=1e6,
            moe=MoESpec(128, 8, 768, qwen_sparse(48), norm_topk_prob=True),
        ),
    ),
    # NOTE: gpt-oss-20b: 24 layers alternating window 128 / full, sinks, 32 experts (4 per token,
    # 2880 wide) in bf16 (not MXFP4); no q/k/v bias, no YaRN.
    "gpt-oss-20b": (
        "tiny",
        dict(
            vocab_size=201088,
            hidden_size=2880,
            num_layers=24,
            num_heads=64,
            num_kv_heads=8,
            head_dim=64,
            intermediate_size=2880,
            rope_theta=150000.0,
            rms_eps=1e-5,
            sliding_window=127,
            global_every=2,
            sinks=True,
            moe=MoESpec(32, 4, 2880, qwen_sparse(24), **GPT_OSS),
        ),
    ),
    # NOTE: DeepSeek-V2-Lite: MLA (no q LoRA), layer 0 dense, 26 layers of 64 experts (6 per
    # token, 1408 wide) plus 2 shared; no YaRN.
    "deepseek-v2-lite": (
        "tiny_mla",
        dict(
            q_lora_rank=None,
            vocab_size=102400,
            hidden_size=2048,
            num_layers=27,
            num_heads=16,
            kv_lora_rank=512,
            qk_nope_head_dim=128,
            qk_rope_head_dim=64,
            v_head_dim=128,
            intermediate_size=10944,
            architecture="DeepseekV2ForCausalLM",
            moe=MoESpec(64, 6, 1408, deepseek_sparse(27, 1), shared_size=2816, router_fp32=True),
        ),
    ),
    # NOTE: OLMoE-1B-7B: 16 layers of 64 experts (8 per token, 1024 wide); no q/k norm here.
    "olmoe-1b-7b": (
        "tiny",
        dict(
            vocab_size=50304,
            hidden_size=2048,
            num_layers=16,
            num_heads=16,
            num_kv_heads=16,
            head_dim=128,
            intermediate_size=1024,
            rms_eps=1e-5,
            moe=MoESpec(64, 8, 1024, qwen_sparse(16)),
        ),
    ),
}


def moe_presets(tiny: Any, tiny_sinks: Any, tiny_mla: Any) -> dict[str, Any]:
    """The MoE presets (``LlamaConfig`` / ``MLAConfig``): the given dense tiny presets
    (``tiny-llama``, ``tiny-sinks``, ``tiny-mla``) with MoE MLPs, and the :data:`REAL` shapes
    made from them (this module cannot import the config classes: :mod:`graphrt.models.presets`
    imports it)."""
    bases = {"tiny": tiny, "tiny_mla": tiny_mla}
    return {
        # NOTE: layer 0 dense (mlp_only_layers), layers 1..3 MoE: both kinds in one decoder.
        "tiny-qwen3-moe": replace(
            tiny, moe=MoESpec(8, 2, 128, qwen_sparse(tiny.num_layers, 1, (0,)), norm_topk_prob=True)
        ),
        "tiny-mixtral": replace(
            tiny, moe=MoESpec(4, 2, 256, qwen_sparse(tiny.num_layers), norm_topk_prob=True)
        ),
        "tiny-deepseek-moe": replace(
            tiny_mla,
            moe=MoESpec(8, 2, 128, deepseek_sparse(tiny_mla.num_layers, 1), shared_size=128, **V3_ROUTER),
        ),
        # NOTE: DeepSeek-V3.2: tiny-deepseek-moe plus the DSA indexer (8 heads of 96, RoPE on
        # the first 64), keeping 16 keys: contexts past 16 drop keys.
        "tiny-deepseek-v3.2": replace(
            tiny_mla,
            architecture="DeepseekV32ForCausalLM",
            moe=MoESpec(8, 2, 128, deepseek_sparse(tiny_mla.num_layers, 1), shared_size=128, **V3_ROUTER),
            indexer=IndexerSpec(n_heads=8, head_dim=96, topk=16),
        ),
        "tiny-gpt-oss": replace(
            tiny_sinks, moe=MoESpec(4, 2, 128, qwen_sparse(tiny_sinks.num_layers), **GPT_OSS)
        ),
    } | {name: replace(bases[base], **fields) for name, (base, fields) in REAL.items()}

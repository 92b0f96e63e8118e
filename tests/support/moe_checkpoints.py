"""Tiny random MoE checkpoints of every family transformers' ``save_pretrained`` writes."""

from __future__ import annotations

from typing import Any

HEADS = dict(num_attention_heads=4, num_key_value_heads=2)
MLA = dict(
    num_attention_heads=4,
    q_lora_rank=None,
    kv_lora_rank=32,
    qk_rope_head_dim=16,
    qk_nope_head_dim=16,
    v_head_dim=24,
)
#: DeepSeek's YaRN, as its released configs write it (V3: ``mscale`` = ``mscale_all_dim`` = 1, so
#: cos/sin keep their size and the softmax scale grows by ``mscale(factor, 1) ** 2``), with a
#: pretraining length (32 = ``SMALL``'s 128 / ``factor``) short enough that the ramp covers rotary dims.
DEEPSEEK_YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 32,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}
#: DeepSeek-V3's MoE (sigmoid router, grouped top-k, a shared expert, layer 0 dense); V3.2's too.
V3_MOE = dict(
    n_routed_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    first_k_dense_replace=1,
    n_shared_experts=1,
    n_group=4,
    topk_group=2,
    routed_scaling_factor=2.5,
)
DEEPSEEK_V3: dict[str, Any] = dict(**MLA, **V3_MOE)
#: id → (model class, config class, config kwargs on top of ``hf_util.SMALL``); layer 0 dense
#: where the family can say so, so both kinds of MLP run in one decoder.
MOE_CASES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "mixtral": (
        "MixtralForCausalLM",
        "MixtralConfig",
        dict(**HEADS, num_local_experts=4, num_experts_per_tok=2),
    ),
    "qwen2-moe-shared-gate": (
        "Qwen2MoeForCausalLM",
        "Qwen2MoeConfig",
        dict(
            **HEADS,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=48,
            mlp_only_layers=[0],
        ),
    ),
    "qwen3-moe-norm-topk": (
        "Qwen3MoeForCausalLM",
        "Qwen3MoeConfig",
        dict(**HEADS, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True),
    ),
    "olmoe": (
        "OlmoeForCausalLM",
        "OlmoeConfig",
        dict(**HEADS, num_experts=4, num_experts_per_tok=2, eos_token_id=2),
    ),
    "deepseek-v2-group-limited": (
        "DeepseekV2ForCausalLM",
        "DeepseekV2Config",
        dict(
            **MLA,
            n_routed_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            first_k_dense_replace=1,
            n_shared_experts=2,
            topk_method="group_limited_greedy",
            n_group=4,
            topk_group=2,
            routed_scaling_factor=1.5,
        ),
    ),
    "deepseek-v3-sigmoid-grouped": ("DeepseekV3ForCausalLM", "DeepseekV3Config", DEEPSEEK_V3),
    "deepseek-v3-yarn": (
        "DeepseekV3ForCausalLM",
        "DeepseekV3Config",
        DEEPSEEK_V3 | {"rope_parameters": DEEPSEEK_YARN},
    ),
    "gpt-oss": (
        "GptOssForCausalLM",
        "GptOssConfig",
        dict(**HEADS, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=8),
    ),
}

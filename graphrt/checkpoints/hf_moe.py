"""A Hugging Face config's mixture-of-experts fields read into a :class:`MoESpec`, one table row
per architecture (the names and defaults transformers' configs use)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from graphrt.checkpoints.errors import CheckpointError
from graphrt.kernels.moe import SWIGLU_ALPHA, SWIGLU_LIMIT
from graphrt.models.moe_config import MoESpec, deepseek_sparse, qwen_sparse

Raw = Mapping[str, Any]
#: Keys naming the routed experts' count, first found wins (transformers 5 writes
#: ``num_local_experts`` for Qwen3-MoE, the Hub's files ``num_experts``).
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


def _int(raw: Raw, key: str, default: int) -> int:
    value = raw.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CheckpointError(f"config {key} = {value!r}: must be an integer >= 0")
    return value


def _qwen_layers(raw: Raw, layers: int) -> tuple[bool, ...]:
    return qwen_sparse(
        layers, max(_int(raw, "decoder_sparse_step", 1), 1), tuple(raw.get("mlp_only_layers") or ())
    )


def _deepseek_layers(raw: Raw, layers: int) -> tuple[bool, ...]:
    return deepseek_sparse(
        layers, _int(raw, "first_k_dense_replace", 0), max(_int(raw, "moe_layer_freq", 1), 1)
    )


def _typed_layers(raw: Raw, layers: int) -> tuple[bool, ...]:
    """DeepSeek-V3.2: ``mlp_layer_types`` (``"dense"`` / ``"sparse"`` per layer) when written,
    else DeepSeek's ``first_k_dense_replace``."""
    types = raw.get("mlp_layer_types")
    if types is None:
        return _deepseek_layers(raw, layers)
    if not isinstance(types, list) or len(types) != layers or not set(types) <= {"dense", "sparse"}:
        raise CheckpointError(
            f"config mlp_layer_types = {types!r}: must list 'dense' or 'sparse' for each of {layers} layers"
        )
    return tuple(t == "sparse" for t in types)


def _all_layers(raw: Raw, layers: int) -> tuple[bool, ...]:
    return (True,) * layers


def _deepseek_v2(raw: Raw) -> dict[str, Any]:
    method = raw.get("topk_method", "greedy")
    scoring = {"greedy": "softmax", "group_limited_greedy": "group_limited"}.get(method)
    if scoring is None:
        raise ValueError(
            f"DeepSeek-V2 topk_method {method!r} is not supported; supported: greedy, group_limited_greedy"
        )
    # NOTE: transformers' DeepSeek-V2 router never renormalises (norm_topk_prob unread).
    groups = _groups(raw, scoring == "group_limited")
    return dict(scoring=scoring, router_fp32=True, **groups, **_shared(raw))


def _deepseek_v3(raw: Raw) -> dict[str, Any]:
    norm = bool(raw.get("norm_topk_prob", True))
    groups = _groups(raw, True)
    return dict(
        scoring="sigmoid", norm_topk_prob=norm, score_bias=True, router_fp32=True, **groups, **_shared(raw)
    )


def _groups(raw: Raw, grouped: bool) -> dict[str, Any]:
    out = {"routed_scaling_factor": float(raw.get("routed_scaling_factor") or 1.0)}
    if grouped:
        out |= {"n_group": _int(raw, "n_group", 1) or 1, "topk_group": _int(raw, "topk_group", 1) or 1}
    return out


def _shared(raw: Raw) -> dict[str, Any]:
    return {"shared_size": _int(raw, "n_shared_experts", 0) * _int(raw, "moe_intermediate_size", 0)}


def _gpt_oss(raw: Raw) -> dict[str, Any]:
    alpha, limit = float(raw.get("swiglu_alpha", SWIGLU_ALPHA)), float(raw.get("swiglu_limit", SWIGLU_LIMIT))
    if (alpha, limit) != (SWIGLU_ALPHA, SWIGLU_LIMIT):
        raise ValueError(
            f"gpt-oss swiglu_alpha {alpha} / swiglu_limit {limit}: only {SWIGLU_ALPHA} / {SWIGLU_LIMIT} are supported"
        )
    return dict(scoring="topk_softmax", router_bias=True, activation="swiglu_clamp", expert_bias=True)


@dataclass(frozen=True, slots=True)
class MoEArch:
    """One architecture's MoE fields: the key of the experts' intermediate size, which layers
    are MoE, and the router and expert details (``extra(raw) -> MoESpec kwargs``)."""

    size_key: str
    layers: Callable[[Raw, int], tuple[bool, ...]]
    extra: Callable[[Raw], dict[str, Any]]


MOE_ARCHS: dict[str, MoEArch] = {
    "MixtralForCausalLM": MoEArch("intermediate_size", _all_layers, lambda raw: {"norm_topk_prob": True}),
    "Qwen2MoeForCausalLM": MoEArch(
        "moe_intermediate_size",
        _qwen_layers,
        lambda raw: {
            "norm_topk_prob": bool(raw.get("norm_topk_prob", False)),
            "shared_size": _int(raw, "shared_expert_intermediate_size", 0),
            "shared_gate": _int(raw, "shared_expert_intermediate_size", 0) > 0,
        },
    ),
    "Qwen3MoeForCausalLM": MoEArch(
        "moe_intermediate_size",
        _qwen_layers,
        lambda raw: {"norm_topk_prob": bool(raw.get("norm_topk_prob", True))},
    ),
    "OlmoeForCausalLM": MoEArch(
        "intermediate_size",
        _all_layers,
        lambda raw: {"norm_topk_prob": bool(raw.get("norm_topk_prob", False))},
    ),
    "DeepseekV2ForCausalLM": MoEArch("moe_intermediate_size", _deepseek_layers, _deepseek_v2),
    "DeepseekV3ForCausalLM": MoEArch("moe_intermediate_size", _deepseek_layers, _deepseek_v3),
    "DeepseekV32ForCausalLM": MoEArch("moe_intermediate_size", _typed_layers, _deepseek_v3),
    "GptOssForCausalLM": MoEArch("intermediate_size", _all_layers, _gpt_oss),
}


def parse_moe(raw: Raw, arch_name: str) -> MoESpec | None:
    """The MoE layers of a ``config.json`` (None when the architecture has none, or no layer is
    MoE); ``ValueError`` names what is not supported."""
    arch = MOE_ARCHS.get(arch_name)
    experts = next((_int(raw, k, 0) for k in EXPERT_KEYS if raw.get(k) is not None), 0)
    if arch is None or experts == 0:
        return None
    if _int(raw, "ep_size", 1) > 1:
        raise ValueError(f"expert parallelism (ep_size {raw['ep_size']}) is not supported")
    layers = arch.layers(raw, int(raw["num_hidden_layers"]))
    if not any(layers):
        return None
    size = _int(raw, arch.size_key, 0)
    if size < 1:
        raise CheckpointError(f"config {arch.size_key} = {raw.get(arch.size_key)!r}: must be >= 1")
    return MoESpec(experts, _int(raw, "num_experts_per_tok", 0), size, layers, **arch.extra(raw))

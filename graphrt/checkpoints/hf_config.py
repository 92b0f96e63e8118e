"""A Hugging Face ``config.json`` read into graphrt's model config; one table row per architecture.

Only the json is read (transformers is not needed to load a checkpoint). Both rope spellings
are accepted: legacy ``rope_theta`` + ``rope_scaling`` and transformers-5 ``rope_parameters``.
DeepSeek-V2/V3 (MLA) and V3.2 (MLA + the DSA indexer) read into an
:class:`~graphrt.models.presets.MLAConfig`. MoE fields
(Mixtral, Qwen2/3-MoE, OLMoE, DeepSeek, gpt-oss) are read by :mod:`graphrt.checkpoints.hf_moe`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from graphrt.checkpoints.errors import CheckpointError
from graphrt.checkpoints.fp8 import fp8_scheme
from graphrt.checkpoints.hf_moe import parse_moe
from graphrt.checkpoints.mxfp4 import quant_method
from graphrt.models.config import ModelConfig
from graphrt.models.indexer import IndexerSpec
from graphrt.models.presets import MLAConfig
from graphrt.models.rope import check_rope_type

Raw = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Arch:
    """What one ``architectures`` entry changes in the shared decoder."""

    #: q/k/v projections carry a bias (``None``: the config's ``attention_bias``, on o too).
    qkv_bias: bool | None = None
    #: RMSNorm over ``head_dim`` on q and k before RoPE (Qwen3).
    qk_norm: bool = False
    #: Which layers slide when ``layer_types`` is absent: ``(raw config, layer) -> bool``.
    sliding: Callable[[Raw, int], bool] = lambda raw, i: False
    #: RMSNorm over the whole q and k projections (all heads at once) before RoPE (OLMoE).
    qk_norm_full: bool = False
    #: Learned attention sinks per query head (gpt-oss).
    sinks: bool = False


def _qwen_sliding(raw: Raw, layer: int) -> bool:
    return bool(raw.get("use_sliding_window")) and layer >= int(raw.get("max_window_layers") or 0)


ARCHS: dict[str, Arch] = {
    "LlamaForCausalLM": Arch(),
    "MistralForCausalLM": Arch(sliding=lambda raw, i: raw.get("sliding_window") is not None),
    "Qwen2ForCausalLM": Arch(qkv_bias=True, sliding=_qwen_sliding),
    "Qwen3ForCausalLM": Arch(qk_norm=True, sliding=_qwen_sliding),
    "MixtralForCausalLM": Arch(sliding=lambda raw, i: raw.get("sliding_window") is not None),
    "Qwen2MoeForCausalLM": Arch(qkv_bias=True, sliding=_qwen_sliding),
    "Qwen3MoeForCausalLM": Arch(qk_norm=True, sliding=_qwen_sliding),
    "OlmoeForCausalLM": Arch(qk_norm_full=True),
    "GptOssForCausalLM": Arch(sinks=True),
}


#: Architectures with multi-head latent attention (:class:`MLAConfig`): dense MLA
#: (DeepSeek-V2/V3), and sparse MLA with the DSA indexer (DeepSeek-V3.2, :data:`DSA_ARCHS`).
MLA_ARCHS = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM")
DSA_ARCHS = ("DeepseekV32ForCausalLM",)


#: Architectures refused by name, with why (a clearer message than "unsupported").
REFUSED: dict[str, str] = {}


def _architecture(raw: Raw) -> str:
    names = list(raw.get("architectures") or [])
    for name in names:
        if name in REFUSED:
            raise ValueError(REFUSED[name])
        if name in ARCHS or name in MLA_ARCHS:
            return name
    found = ", ".join(names) or "none (no 'architectures' in config.json)"
    raise ValueError(f"unsupported architecture {found}; supported: {', '.join([*ARCHS, *MLA_ARCHS])}")


def _rope(raw: Raw) -> tuple[float, str, dict[str, Any]]:
    """``(theta, rope_type, params)`` from ``rope_parameters`` or ``rope_theta`` + ``rope_scaling``."""
    # NOTE: as in transformers, a legacy ``rope_scaling`` wins over ``rope_parameters``.
    modern = dict(raw.get("rope_parameters") or {})
    params = dict(raw.get("rope_scaling") or modern)
    theta = float(params.get("rope_theta", raw.get("rope_theta", modern.get("rope_theta", 10000.0))))
    if not 0 < theta < math.inf:
        raise CheckpointError(f"config rope_theta = {theta}: must be a finite number > 0")
    rope_type = str(params.get("rope_type", params.get("type", "default")))
    check_rope_type(rope_type)
    params.setdefault("original_max_position_embeddings", raw.get("max_position_embeddings", 2048))
    if rope_type in SCALED:
        _check_scaling(params, rope_type)
    params["rope_theta"] = theta
    if float(params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))) != 1.0:
        raise ValueError("partial_rotary_factor != 1 is not supported")
    return theta, rope_type, params


#: Rope types whose ``factor`` stretches the context.
SCALED = ("linear", "llama3", "yarn")
#: Their numbers that must be > 0 (``factor`` required), and those where 0 means off or default.
ROPE_POSITIVE = ("factor", "original_max_position_embeddings")
ROPE_NONNEGATIVE = ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor")


def _check_scaling(params: Raw, rope_type: str) -> None:
    """:class:`CheckpointError` for a scaled rope's number that is missing (``factor``), not a
    finite number, or out of range."""
    for name in (*ROPE_POSITIVE, *ROPE_NONNEGATIVE):
        value, strict = params.get(name), name in ROPE_POSITIVE
        if value is None and name != "factor":
            continue
        number = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        if not number or value < 0 or (strict and value == 0):
            raise CheckpointError(
                f"config rope_type {rope_type!r} {name} = {value!r}: must be a finite number "
                + ("> 0" if strict else ">= 0")
            )


def _windows(raw: Raw, arch: Arch, num_layers: int) -> tuple[int | None, ...]:
    """graphrt windows per layer; HF's ``sliding_window`` ``w`` keeps ``w`` keys, graphrt's ``w - 1``."""
    types = raw.get("layer_types")
    sliding = [
        (types[i] == "sliding_attention") if types else arch.sliding(raw, i) for i in range(num_layers)
    ]
    size = raw.get("sliding_window")
    if not any(sliding) or not size:
        return ()
    return tuple(int(size) - 1 if s else None for s in sliding)


#: The FP8 checkpoint formats that load (:mod:`graphrt.checkpoints.fp8`), for messages.
FP8_FORMATS = "compressed-tensors float-quantized channel/tensor scales, fp8 block/tensor scales"


def _refuse_unsupported(raw: Raw, arch_name: str) -> None:
    if fp8_scheme(raw) is None:  # NOTE: refuses an FP8 scheme graphrt does not read, by name
        try:
            quant_method(raw, arch_name)  # NOTE: refuses what is not dequantized at load (mxfp4 for gpt-oss)
        except ValueError as err:
            raise ValueError(f"{err}; FP8 checkpoints load for every architecture ({FP8_FORMATS})") from None
    if raw.get("mlp_bias"):
        raise ValueError("mlp_bias=True is not supported")
    if raw.get("clip_qkv") is not None:
        raise ValueError(f"clip_qkv={raw['clip_qkv']} is not supported")
    if raw.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {raw['hidden_act']!r} is not supported; supported: silu")


#: Most decoder layers a config may name (the largest models have ~130): the config is read per
#: layer (windows, layer types) before any tensor is, so a damaged ``2**40`` would loop for ever.
MAX_LAYERS = 4096
#: Integer sizes of a config: name → (required, least value); ``None`` or absent skips an optional one.
SIZES: dict[str, tuple[bool, int]] = {
    "vocab_size": (True, 1),
    "hidden_size": (True, 1),
    "num_hidden_layers": (True, 1),
    "num_attention_heads": (True, 1),
    "intermediate_size": (True, 1),
    "num_key_value_heads": (False, 1),
    "head_dim": (False, 1),
    "max_position_embeddings": (False, 1),
    "sliding_window": (False, 0),  # NOTE: Qwen2-MoE writes 0 for "no window"
}
#: DeepSeek-V2/V3 (dense MLA) sizes on top of :data:`SIZES`.
MLA_SIZES: dict[str, tuple[bool, int]] = {
    "kv_lora_rank": (True, 1),
    "qk_nope_head_dim": (True, 1),
    "qk_rope_head_dim": (True, 1),
    "v_head_dim": (True, 1),
    "q_lora_rank": (False, 1),
    "n_routed_experts": (False, 0),
    "first_k_dense_replace": (False, 0),
}
#: DeepSeek-V3.2's indexer sizes on top of :data:`MLA_SIZES`.
DSA_SIZES: dict[str, tuple[bool, int]] = {
    "index_n_heads": (True, 1),
    "index_head_dim": (True, 1),
    "index_topk": (True, 1),
    "q_lora_rank": (True, 1),
}
#: Numbers a config may give, which must be finite and > 0.
POSITIVE = ("rms_norm_eps", "rope_theta")


def check_sizes(raw: Raw, mla: bool, dsa: bool = False) -> None:
    """Raise :class:`CheckpointError` on a config whose sizes no model can have: a size that
    is missing, not an int, or below its least value; KV heads that do not divide the heads, or
    heads that do not divide the hidden size without ``head_dim`` (MHA/GQA); a norm epsilon or
    rope base that is not a finite number > 0."""
    sizes = SIZES | (MLA_SIZES if mla else {}) | (DSA_SIZES if dsa else {})
    for name, (required, least) in sizes.items():
        value = raw.get(name)
        if value is None:
            if required:
                raise CheckpointError(f"config has no {name!r}")
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise CheckpointError(f"config {name} must be an integer, got {value!r}")
        if value < least:
            raise CheckpointError(f"config {name} = {value}: must be >= {least}")
    if raw["num_hidden_layers"] > MAX_LAYERS:
        raise CheckpointError(f"config num_hidden_layers = {raw['num_hidden_layers']}: at most {MAX_LAYERS}")
    heads, kv = raw["num_attention_heads"], raw.get("num_key_value_heads") or raw["num_attention_heads"]
    if not mla and heads % kv:
        raise CheckpointError(
            f"config num_key_value_heads = {kv} does not divide num_attention_heads = {heads}"
        )
    if not mla and not raw.get("head_dim") and raw["hidden_size"] % heads:
        raise CheckpointError(
            f"config num_attention_heads = {heads} does not divide hidden_size = {raw['hidden_size']} "
            "(and there is no head_dim)"
        )
    for name in POSITIVE:
        value = raw.get(name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf
        ):
            raise CheckpointError(f"config {name} = {value!r}: must be a finite number > 0")


def parse_mla_config(raw: Raw, arch_name: str) -> MLAConfig:
    """A DeepSeek-V2/V3/V3.2 ``config.json`` (dense and MoE layers; V3.2's indexer); ``ValueError``
    names what is not supported."""
    # NOTE: YaRN (and mscale_all_dim on any scaled type) reaches the model through rope_params:
    # the softmax scale (MLAConfig.softmax_scale) and the attention factor on cos/sin.
    theta, rope_type, rope_params = _rope(raw)
    q_lora = raw.get("q_lora_rank")
    return MLAConfig(
        vocab_size=int(raw["vocab_size"]),
        hidden_size=int(raw["hidden_size"]),
        num_layers=int(raw["num_hidden_layers"]),
        num_heads=int(raw["num_attention_heads"]),
        kv_lora_rank=int(raw["kv_lora_rank"]),
        qk_nope_head_dim=int(raw["qk_nope_head_dim"]),
        qk_rope_head_dim=int(raw["qk_rope_head_dim"]),
        v_head_dim=int(raw["v_head_dim"]),
        intermediate_size=int(raw["intermediate_size"]),
        q_lora_rank=None if q_lora is None else int(q_lora),
        rope_theta=theta,
        rope_type=rope_type,
        rope_params=rope_params,
        rms_eps=float(raw.get("rms_norm_eps", 1e-6)),
        # NOTE: V2 always rotates interleaved pairs (complex form); V3 unless rope_interleave is off.
        rope_interleave=arch_name == "DeepseekV2ForCausalLM" or bool(raw.get("rope_interleave", True)),
        attention_bias=bool(raw.get("attention_bias", False)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        architecture=arch_name,
        max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
        moe=parse_moe(raw, arch_name),
        indexer=_indexer(raw) if arch_name in DSA_ARCHS else None,
    )


def _indexer(raw: Raw) -> IndexerSpec:
    """DeepSeek-V3.2's ``index_n_heads`` / ``index_head_dim`` / ``index_topk``."""
    return IndexerSpec(int(raw["index_n_heads"]), int(raw["index_head_dim"]), int(raw["index_topk"]))


def parse_config(raw: Raw) -> ModelConfig | MLAConfig:
    """Read a ``config.json`` dict; ``ValueError`` names what graphrt does not support,
    :class:`CheckpointError` (a ``ValueError``) a config no model can have."""
    if not isinstance(raw, Mapping):
        raise CheckpointError(f"config must be a JSON object, got {type(raw).__name__}")
    arch_name = _architecture(raw)
    check_sizes(raw, mla=arch_name in MLA_ARCHS, dsa=arch_name in DSA_ARCHS)
    _refuse_unsupported(raw, arch_name)
    if arch_name in MLA_ARCHS:
        return parse_mla_config(raw, arch_name)
    arch = ARCHS[arch_name]
    theta, rope_type, rope_params = _rope(raw)
    attention_bias = bool(raw.get("attention_bias", False))
    heads, layers = int(raw["num_attention_heads"]), int(raw["num_hidden_layers"])
    return ModelConfig(
        architecture=arch_name,
        vocab_size=int(raw["vocab_size"]),
        hidden_size=int(raw["hidden_size"]),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=int(raw.get("head_dim") or int(raw["hidden_size"]) // heads),
        intermediate_size=int(raw["intermediate_size"]),
        rms_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_type=rope_type,
        rope_params=rope_params,
        qkv_bias=arch.qkv_bias if arch.qkv_bias is not None else attention_bias,
        o_bias=attention_bias if arch.qkv_bias is None else False,
        qk_norm=arch.qk_norm,
        qk_norm_full=arch.qk_norm_full,
        sinks=arch.sinks,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
        windows=_windows(raw, arch, layers),
        moe=parse_moe(raw, arch_name),
    )

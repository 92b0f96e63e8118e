"""GGUF mixture-of-experts models: llama.cpp's metadata and merged expert tensors in Hugging Face terms.

llama.cpp stores a MoE layer's routed experts merged, one 3-D tensor per projection
(``blk.N.ffn_gate_exps.weight`` ``[E, I, H]``, ``ffn_up_exps`` ``[E, I, H]``, ``ffn_down_exps``
``[E, H, I]``), the router as ``ffn_gate_inp``, the shared expert as ``ffn_*_shexp`` and
DeepSeek-V3's score bias as ``exp_probs_b``. Its keys (``{arch}.expert_count``, ...) become the
``config.json`` keys transformers uses, so :mod:`graphrt.checkpoints.hf_moe` reads them as it
reads a Hugging Face config, and the tensors come out under the names
:mod:`graphrt.checkpoints.moe_tensors` maps (the fused ``experts.gate_up_proj`` /
``experts.down_proj`` layout). DeepSeek-V2/V3 (``deepseek2``) attention is MLA: newer converters
split ``kv_b_proj`` into ``attn_k_b`` (per head, transposed) and ``attn_v_b``; both spellings load.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from graphrt.checkpoints.errors import CheckpointError
from graphrt.checkpoints.hf_config import MAX_LAYERS
from graphrt.checkpoints.moe_tensors import MOE_NAMES

Shape = tuple[int, ...]
Raw = dict[str, Any]
#: A GGUF metadata key → its value (None: absent).
Field = Callable[[str], Any]
#: gguf's ``ExpertGatingFuncType`` values.
GATING = {1: "softmax", 2: "sigmoid"}
#: ``{arch}.<key>`` MoE metadata → ``config.json`` key, for every MoE arch.
MOE_KEYS = {
    "expert_count": "num_experts",
    "expert_used_count": "num_experts_per_tok",
    "expert_shared_feed_forward_length": "shared_expert_intermediate_size",
    "expert_shared_count": "n_shared_experts",
    "expert_weights_norm": "norm_topk_prob",
    "expert_weights_scale": "routed_scaling_factor",
    "expert_group_count": "n_group",
    "expert_group_used_count": "topk_group",
    "leading_dense_block_count": "first_k_dense_replace",
    "attention.sliding_window": "sliding_window",
}


def _need(field: Field, *keys: str) -> Any:
    """The first of metadata ``keys`` the file has; :class:`CheckpointError` naming them if none."""
    for key in keys:
        value = field(key)
        if value is not None:
            return value
    raise CheckpointError(f"no metadata key {' or '.join(map(repr, keys))}")


def _layers(raw: Raw) -> range:
    """The decoder's layers, none for a count :func:`~graphrt.checkpoints.hf_config.check_sizes`
    refuses next (a damaged ``block_count`` of ``2**40`` would loop for ever here)."""
    n = raw.get("num_hidden_layers")
    return range(n if isinstance(n, int) and 0 < n <= MAX_LAYERS else 0)


def _qwen(raw: Raw, arch: str, field: Field, tensors: Mapping[str, Any]) -> None:
    """Qwen-MoE's dense layers: those without a router (llama.cpp has no ``mlp_only_layers``)."""
    raw["mlp_only_layers"] = [i for i in _layers(raw) if f"blk.{i}.ffn_gate_inp.weight" not in tensors]


def _gpt_oss(raw: Raw, arch: str, field: Field, tensors: Mapping[str, Any]) -> None:
    """gpt-oss: llama.cpp's SWA pattern 2 (even layers slide), transformers' default too."""
    raw["layer_types"] = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in _layers(raw)]
    raw["attention_bias"] = True
    if "rope_scaling" in raw:  # NOTE: its YaRN does not round the ramp's ends (no GGUF key says so)
        raw["rope_scaling"]["truncate"] = False


def _deepseek(raw: Raw, arch: str, field: Field, tensors: Mapping[str, Any]) -> None:
    """DeepSeek-V2/V3's MLA sizes and router; V3 (sigmoid gating) or V2 (softmax)."""
    rope = int(_need(field, f"{arch}.rope.dimension_count"))
    key = _need(field, f"{arch}.attention.key_length_mla", f"{arch}.attention.key_length")
    value = _need(field, f"{arch}.attention.value_length_mla", f"{arch}.attention.value_length")
    q_lora = field(f"{arch}.attention.q_lora_rank")
    raw |= {
        "kv_lora_rank": _need(field, f"{arch}.attention.kv_lora_rank"),
        "q_lora_rank": q_lora or None,  # NOTE: llama.cpp writes 0 for "no q LoRA" in some files
        "qk_rope_head_dim": rope,
        "qk_nope_head_dim": int(key) - rope,
        "v_head_dim": value,
    }
    for name in ("head_dim", "num_key_value_heads"):  # NOTE: MLA's "MQA" view, not the model's heads
        raw.pop(name, None)
    if (raw.get("rope_scaling") or {}).get("rope_type") == "yarn":
        _deepseek_yarn(raw["rope_scaling"], arch, field)
    if GATING.get(field(f"{arch}.expert_gating_func") or 1) == "sigmoid":
        raw["scoring_func"] = "sigmoid"
        raw["architectures"] = ["DeepseekV3ForCausalLM"]
        return
    grouped = (raw.get("n_group") or 1) > 1
    raw["topk_method"] = "group_limited_greedy" if grouped else "greedy"


#: YaRN keys whose llama.cpp meaning for ``deepseek2`` has no transformers counterpart here.
DEEPSEEK_YARN_REFUSED = ("attn_factor", "yarn_attn_factor", "yarn_ext_factor")


def _deepseek_yarn(rope: Raw, arch: str, field: Field) -> None:
    """DeepSeek's YaRN as llama.cpp runs ``deepseek2``: the converter writes
    ``yarn_log_multiplier = 0.1 * mscale_all_dim`` (the softmax scale's ``mscale``), and llama.cpp
    takes ``mscale == mscale_all_dim``, so cos/sin are not rescaled (``attention_factor`` 1)."""
    for key in DEEPSEEK_YARN_REFUSED:
        if field(f"{arch}.rope.scaling.{key}") is not None:
            raise ValueError(f"GGUF {arch} with metadata {arch}.rope.scaling.{key} is not supported (YaRN)")
    log_mul = field(f"{arch}.rope.scaling.yarn_log_multiplier")
    rope["attention_factor"] = 1.0
    if log_mul:
        rope["mscale_all_dim"] = float(log_mul) / 0.1
    for key in ("beta_fast", "beta_slow"):
        value = field(f"{arch}.rope.scaling.yarn_{key}")
        if value is not None:
            rope[key] = value


def _none(raw: Raw, arch: str, field: Field, tensors: Mapping[str, Any]) -> None:
    return None


@dataclass(frozen=True, slots=True)
class MoEArch:
    """One llama.cpp MoE architecture: the transformers class, the config key
    ``expert_feed_forward_length`` fills, ``norm_topk_prob`` where the file has no
    ``expert_weights_norm`` (what llama.cpp fixes for the arch), and the family's own keys
    (``extra(raw, arch, field, tensors)``, in place)."""

    architecture: str
    size_key: str
    norm_topk: bool = False
    extra: Callable[[Raw, str, Field, Mapping[str, Any]], None] = _none


GGUF_MOE: dict[str, MoEArch] = {
    "qwen3moe": MoEArch("Qwen3MoeForCausalLM", "moe_intermediate_size", norm_topk=True, extra=_qwen),
    "qwen2moe": MoEArch("Qwen2MoeForCausalLM", "moe_intermediate_size", extra=_qwen),
    "llama": MoEArch("MixtralForCausalLM", "intermediate_size", norm_topk=True),
    "olmoe": MoEArch("OlmoeForCausalLM", "intermediate_size"),
    "deepseek2": MoEArch("DeepseekV2ForCausalLM", "moe_intermediate_size", extra=_deepseek),
    "gpt-oss": MoEArch("GptOssForCausalLM", "intermediate_size", extra=_gpt_oss),
}


def has_experts(arch: str, field: Field, tensors: Mapping[str, Any]) -> bool:
    """Whether the file holds MoE layers (an expert count, or merged expert tensors)."""
    return bool(field(f"{arch}.expert_count")) or any("_exps." in n for n in tensors)


def moe_config(arch: str, field: Field, tensors: Mapping[str, Any], raw: Raw) -> None:
    """Add the MoE keys of GGUF ``arch`` to ``raw`` (a ``config.json``-style dict), whose
    ``architectures`` become the transformers MoE class."""
    family = GGUF_MOE[arch]
    for key, hf_key in MOE_KEYS.items():
        value = field(f"{arch}.{key}")
        if value is not None:
            raw[hf_key] = value
    size = field(f"{arch}.expert_feed_forward_length")
    if size is not None:
        raw[family.size_key] = size
    raw.setdefault("norm_topk_prob", family.norm_topk)
    raw["architectures"] = [family.architecture]
    family.extra(raw, arch, field, tensors)


@dataclass(frozen=True, slots=True)
class Joined:
    """One Hugging Face tensor made of GGUF tensors: ``parts`` (GGUF names) dequantised, then
    ``join(*parts)``."""

    parts: tuple[str, ...]
    join: Callable[..., torch.Tensor]

    def shape(self, shapes: Mapping[str, Shape]) -> Shape:
        """The joined tensor's shape (the join run on meta tensors of the parts' shapes)."""
        metas = (torch.empty(shapes[p], device="meta") for p in self.parts)
        return tuple(self.join(*metas).shape)


def _gate_up(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``[E, I, H]`` gate and up → transformers' ``experts.gate_up_proj`` ``[E, 2 I, H]``."""
    return torch.cat((gate, up), dim=1)


def _interleave_t(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gpt-oss: ``[E, I, H]`` gate and up → its ``[E, H, 2 I]`` (gate at even columns)."""
    return torch.stack((gate, up), dim=2).flatten(1, 2).transpose(1, 2)


def _interleave_bias(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return torch.stack((gate, up), dim=2).flatten(1, 2)


def _transpose(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(1, 2)


def _kv_b(k_b: torch.Tensor, v_b: torch.Tensor) -> torch.Tensor:
    """``attn_k_b`` ``[heads, rank, nope]`` and ``attn_v_b`` ``[heads, v, rank]`` → ``kv_b_proj``
    ``[heads (nope + v), rank]`` (the inverse of ``convert_hf_to_gguf.py``'s split)."""
    return torch.cat((k_b.transpose(1, 2), v_b), dim=1).flatten(0, 1)


def _same(t: torch.Tensor) -> torch.Tensor:
    return t


def _row(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(1, -1)


def moe_layer_names(architecture: str) -> dict[str, str]:
    """Per layer GGUF tensor (``blk.N.<key>``, suffix included) → Hugging Face name under
    ``model.layers.N.``: the router, score bias, shared expert and MLA attention tensors."""
    names = MOE_NAMES[architecture]
    block, shared = names.block, names.shared
    out = {
        "ffn_gate_inp.weight": f"{block}.{names.router}.weight",
        "ffn_gate_inp.bias": f"{block}.{names.router}.bias",
        "exp_probs_b.bias": f"{block}.{names.router}.e_score_correction_bias",
        "attn_sinks.weight": "self_attn.sinks",
        "post_attention_norm.weight": "post_attention_layernorm.weight",
    }
    for proj in ("gate", "up", "down"):
        out[f"ffn_{proj}_shexp.weight"] = f"{block}.{shared}.{proj}_proj.weight"
    mla = {"q": "q_proj", "q_a": "q_a_proj", "q_a_norm": "q_a_layernorm", "q_b": "q_b_proj"}
    mla |= {"kv_a_mqa": "kv_a_proj_with_mqa", "kv_a_norm": "kv_a_layernorm", "kv_b": "kv_b_proj"}
    if architecture.startswith("Deepseek"):
        out |= {f"attn_{g}.weight": f"self_attn.{hf}.weight" for g, hf in mla.items()}
    return out


def moe_joined(architecture: str, layers: int, tensors: Mapping[str, Any]) -> dict[str, Joined]:
    """The Hugging Face tensors made of several GGUF tensors (or reshaped), by HF name: each
    MoE layer's merged experts, Qwen2-MoE's shared-expert gate, MLA's split ``kv_b``."""
    names = MOE_NAMES[architecture]
    out: dict[str, Joined] = {}
    for i in range(layers):
        blk, pre = f"blk.{i}", f"model.layers.{i}.{names.block}.experts"
        gate, up, down = (f"{blk}.ffn_{p}_exps" for p in ("gate", "up", "down"))
        if f"{gate}.weight" in tensors:
            join, down_join = (_interleave_t, _transpose) if names.interleaved else (_gate_up, _same)
            out[f"{pre}.gate_up_proj"] = Joined((f"{gate}.weight", f"{up}.weight"), join)
            out[f"{pre}.down_proj"] = Joined((f"{down}.weight",), down_join)
        if f"{gate}.bias" in tensors:
            out[f"{pre}.gate_up_proj_bias"] = Joined((f"{gate}.bias", f"{up}.bias"), _interleave_bias)
            out[f"{pre}.down_proj_bias"] = Joined((f"{down}.bias",), _same)
        if f"{blk}.ffn_gate_inp_shexp.weight" in tensors:
            out[f"model.layers.{i}.{names.block}.shared_expert_gate.weight"] = Joined(
                (f"{blk}.ffn_gate_inp_shexp.weight",), _row
            )
        if f"{blk}.attn_k_b.weight" in tensors:
            out[f"model.layers.{i}.self_attn.kv_b_proj.weight"] = Joined(
                (f"{blk}.attn_k_b.weight", f"{blk}.attn_v_b.weight"), _kv_b
            )
    return out

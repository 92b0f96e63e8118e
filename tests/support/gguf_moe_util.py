"""Write a saved transformers MoE checkpoint as a GGUF file the way llama.cpp's
``convert_hf_to_gguf.py`` does (no downloads, no llama.cpp checkout).

The saved safetensors (the Hub's names, one tensor per expert) are read back; per-expert
weights are stacked into llama.cpp's merged ``ffn_{gate,up,down}_exps`` ``[E, I, H]`` /
``[E, H, I]``; the ``llama`` architecture's q/k rows are permuted; DeepSeek's ``kv_b_proj`` is
split into ``attn_k_b`` (transposed per head) and ``attn_v_b``; gpt-oss's interleaved
``gate_up_proj`` is taken apart. Every other name goes through gguf's own ``TensorNameMap`` (the
converter's table); the MoE metadata keys are the converter's. Weights of two or more
dimensions whose rows are whole blocks are stored in ``qtype`` (the router stays F32, as the
converter keeps it); :func:`roundtrip` gives the transformers model the same rounding.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tests.support.gguf_util import permute

#: transformers ``model_type`` → gguf ``MODEL_ARCH`` member.
ARCHS = {
    "mixtral": "LLAMA",
    "qwen2_moe": "QWEN2MOE",
    "qwen3_moe": "QWEN3MOE",
    "olmoe": "OLMOE",
    "deepseek_v2": "DEEPSEEK2",
    "deepseek_v3": "DEEPSEEK2",
    "gpt_oss": "GPT_OSS",
}
#: Per-expert projection name → merged gguf tensor (Mixtral's w1 / w3 / w2 included).
EXPERT_TENSORS = {
    "gate_proj": "FFN_GATE_EXP",
    "up_proj": "FFN_UP_EXP",
    "down_proj": "FFN_DOWN_EXP",
    "w1": "FFN_GATE_EXP",
    "w3": "FFN_UP_EXP",
    "w2": "FFN_DOWN_EXP",
}
_EXPERT = re.compile(r"model\.layers\.(\d+)\.\w+\.experts\.(\d+)\.(\w+)\.weight")
#: Hugging Face names the converter keeps in F32 whatever the type asked for (the routers).
F32_NAMES = (
    "mlp.gate.weight",
    "block_sparse_moe.gate.weight",
    "mlp.router.weight",
    "shared_expert_gate.weight",
)


def _name(kind: str, bid: int | None, suffix: str = "weight") -> str:
    import gguf

    return f"{gguf.TENSOR_NAMES[gguf.MODEL_TENSOR[kind]].format(bid=bid)}.{suffix}"


def _metadata(writer: Any, cfg: dict[str, Any], model_type: str) -> None:
    """``set_gguf_parameters`` of the converter's base model and MoE families."""
    import gguf

    rope = cfg.get("rope_parameters") or {}
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(cfg["num_attention_heads"])
    mla = model_type.startswith("deepseek")
    if not mla:
        writer.add_head_count_kv(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    writer.add_rope_freq_base(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    writer.add_vocab_size(cfg["vocab_size"])
    writer.add_expert_count(cfg.get("num_local_experts") or cfg.get("num_experts") or cfg["n_routed_experts"])
    writer.add_expert_used_count(cfg["num_experts_per_tok"])
    if cfg.get("n_group") is not None:
        writer.add_expert_group_count(cfg["n_group"])
        writer.add_expert_group_used_count(cfg["topk_group"])
    if cfg.get("head_dim") is not None and not mla:
        writer.add_key_length(cfg["head_dim"])
        writer.add_value_length(cfg["head_dim"])
    if model_type in ("qwen2_moe", "qwen3_moe"):
        writer.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        if cfg.get("shared_expert_intermediate_size"):
            writer.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    elif mla:
        _deepseek(writer, cfg, gguf.ExpertGatingFuncType)
        if rope.get("rope_type") == "yarn":
            _yarn(writer, rope)
    elif model_type == "gpt_oss":
        writer.add_expert_feed_forward_length(cfg["intermediate_size"])
        writer.add_sliding_window(cfg["sliding_window"])
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(rope["factor"])
        writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])


def _deepseek(writer: Any, cfg: dict[str, Any], gating: Any) -> None:
    """``DeepseekV2Model.set_gguf_parameters``: MLA as MQA of larger heads, the MoE keys."""
    rank, rope = cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    writer.add_head_count_kv(1)
    writer.add_leading_dense_block_count(cfg["first_k_dense_replace"])
    if cfg.get("q_lora_rank") is not None:
        writer.add_q_lora_rank(cfg["q_lora_rank"])
    writer.add_kv_lora_rank(rank)
    writer.add_key_length(rank + rope)
    writer.add_value_length(rank)
    writer.add_key_length_mla(cfg["qk_nope_head_dim"] + rope)
    writer.add_value_length_mla(cfg["v_head_dim"])
    writer.add_rope_dimension_count(rope)
    writer.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    writer.add_expert_shared_count(cfg["n_shared_experts"])
    writer.add_expert_weights_scale(cfg["routed_scaling_factor"])
    writer.add_expert_weights_norm(bool(cfg.get("norm_topk_prob", False)))
    sigmoid = cfg.get("scoring_func", "softmax") == "sigmoid" or cfg["model_type"] == "deepseek_v3"
    writer.add_expert_gating_func(gating.SIGMOID if sigmoid else gating.SOFTMAX)


def _yarn(writer: Any, rope: dict[str, Any]) -> None:
    """The converter's YaRN keys for DeepSeek: the base model's, and ``yarn_log_multiplier`` as
    ``0.1 * mscale_all_dim`` (``DeepseekV2Model``'s legacy form)."""
    import gguf

    writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    writer.add_rope_scaling_factor(rope["factor"])
    writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    writer.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
    writer.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
    if rope.get("mscale_all_dim") is not None:
        writer.add_rope_scaling_yarn_log_mul(0.1 * rope["mscale_all_dim"])


def _gpt_oss(name: str, t: torch.Tensor, bid: int) -> Iterator[tuple[str, torch.Tensor]]:
    """gpt-oss's fused experts: ``[E, H, 2 I]`` gate/up interleaved → merged ``[E, I, H]``."""
    if name.endswith("gate_up_proj"):
        yield _name("FFN_GATE_EXP", bid), t[..., 0::2].transpose(1, 2)
        yield _name("FFN_UP_EXP", bid), t[..., 1::2].transpose(1, 2)
    elif name.endswith("gate_up_proj_bias"):
        yield _name("FFN_GATE_EXP", bid, "bias"), t[..., 0::2]
        yield _name("FFN_UP_EXP", bid, "bias"), t[..., 1::2]
    elif name.endswith("down_proj"):
        yield _name("FFN_DOWN_EXP", bid), t.transpose(1, 2)
    else:
        yield _name("FFN_DOWN_EXP", bid, "bias"), t


def _tensors(
    tensors: dict[str, torch.Tensor], cfg: dict[str, Any], arch: Any, split_kv_b: bool
) -> Iterator[tuple[str, torch.Tensor]]:
    """The converter's ``modify_tensors``: gguf names and data, experts merged per layer;
    ``split_kv_b``: DeepSeek's ``kv_b_proj`` as newer converters write it (else as older ones)."""
    import gguf

    names = gguf.get_tensor_name_map(arch, cfg["num_hidden_layers"])
    experts: dict[tuple[int, str], dict[int, torch.Tensor]] = {}
    for name, t in tensors.items():
        if name == "lm_head.weight" and cfg.get("tie_word_embeddings"):
            continue
        bid = int(name.split(".")[2]) if name.startswith("model.layers.") else None
        if (m := _EXPERT.fullmatch(name)) is not None:
            experts.setdefault((bid, EXPERT_TENSORS[m[3]]), {})[int(m[2])] = t
        elif ".experts." in name:
            yield from _gpt_oss(name, t, bid)
        elif name.endswith("e_score_correction_bias"):
            yield _name("FFN_EXP_PROBS_B", bid, "bias"), t
        elif name.endswith("self_attn.sinks"):
            yield _name("ATTN_SINKS", bid), t
        elif split_kv_b and name.endswith("kv_b_proj.weight"):
            heads, nope = cfg["num_attention_heads"], cfg["qk_nope_head_dim"]
            k_b, v_b = t.view(heads, nope + cfg["v_head_dim"], -1).split([nope, cfg["v_head_dim"]], dim=1)
            yield _name("ATTN_K_B", bid), k_b.transpose(1, 2)
            yield _name("ATTN_V_B", bid), v_b
        else:
            if arch == gguf.MODEL_ARCH.LLAMA and name.endswith(("q_proj.weight", "k_proj.weight")):
                key = "num_attention_heads" if "q_proj" in name else "num_key_value_heads"
                t = torch.from_numpy(permute(t.numpy(), cfg[key]))
            yield names.get_name(name, try_suffixes=(".weight", ".bias")), t
    for (bid, kind), by_expert in experts.items():
        yield _name(kind, bid), torch.stack([by_expert[x] for x in sorted(by_expert)])


def quantizable(name: str, shape: tuple[int, ...], qtype: str) -> bool:
    """Whether a weight is stored in ``qtype``: two or more dims, whole blocks a row, not a
    router nor a bias; MXFP4 only for the experts (as llama.cpp writes gpt-oss)."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    block = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]][0]
    if qtype == "MXFP4" and "exps" not in name and ".experts." not in name:
        return False
    return (
        qtype != "F32"
        and len(shape) >= 2
        and shape[-1] % block == 0
        and not name.endswith((*F32_NAMES, "bias"))
    )


def write_moe_gguf(
    checkpoint: Path, path: Path, qtype: str = "F32", split_kv_b: bool = True, drop: tuple[str, ...] = ()
) -> Path:
    """Convert the transformers checkpoint directory ``checkpoint`` into GGUF ``path``
    (``split_kv_b``: see :func:`_tensors`); GGUF tensors named in ``drop`` are left out (a
    damaged file)."""
    import gguf
    from gguf.quants import quantize
    from safetensors.torch import load_file

    cfg = json.loads((checkpoint / "config.json").read_text())
    arch = gguf.MODEL_ARCH[ARCHS[cfg["model_type"]]]
    tensors = {n: t.float() for n, t in load_file(str(checkpoint / "model.safetensors")).items()}
    writer = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[arch])
    _metadata(writer, cfg, cfg["model_type"])
    qt = gguf.GGMLQuantizationType[qtype]
    gate_inp = gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.FFN_GATE_INP].split(".")[-1]
    for name, t in _tensors(tensors, cfg, arch, split_kv_b):
        w = np.ascontiguousarray(t.numpy())
        if name in drop:
            continue
        if gate_inp not in name and quantizable(name, w.shape, qtype):
            writer.add_tensor(name, quantize(w, qt), raw_dtype=qt)
        else:
            writer.add_tensor(name, w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@torch.no_grad()
def roundtrip(model: torch.nn.Module, qtype: str) -> torch.nn.Module:
    """``model`` with every weight :func:`write_moe_gguf` stores in ``qtype`` rounded as it is
    (quantised and dequantised along the rows the file holds: a merged or permuted tensor's
    blocks are the same; gpt-oss's fused experts are transposed in the file, so here too)."""
    import gguf
    from gguf.quants import dequantize, quantize

    qt = gguf.GGMLQuantizationType[qtype]
    transposed = model.config.model_type == "gpt_oss"
    for name, p in model.named_parameters():
        w = p.detach().float()
        if transposed and name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            w = w.transpose(1, 2)
        if quantizable(name, tuple(w.shape), qtype):
            w = w.contiguous().numpy()
            w = torch.from_numpy(dequantize(quantize(w, qt), qt).reshape(w.shape))
            p.copy_(w.transpose(1, 2) if transposed and w.ndim == 3 else w)
    return model

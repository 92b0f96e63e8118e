"""Write a transformers model as a GGUF file the way llama.cpp's converter does (no downloads).

Names go to llama.cpp's (``blk.N.attn_q.weight``), the ``llama`` architecture's q/k rows are
permuted (interleaved RoPE pairs), 2-D weights are quantised with ``gguf.quants.quantize``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from graphrt.checkpoints.gguf_file import GLOBAL_NAMES, LAYER_NAMES

TO_GGUF = {hf: g for g, hf in GLOBAL_NAMES.items()} | {
    f"{hf}.{kind}": f"{g}.{kind}" for g, hf in LAYER_NAMES.items() for kind in ("weight", "bias")
}


def gguf_name(name: str) -> str:
    if name in TO_GGUF:
        return TO_GGUF[name]
    _, _, layer, rest = name.split(".", 3)
    return f"blk.{layer}.{TO_GGUF[rest]}"


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's ``convert_hf_to_gguf`` q/k permute (NeoX halves → interleaved pairs)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(
    path: Path, model: torch.nn.Module, arch: str, qtype: str, rope_freqs: np.ndarray | None = None
) -> Path:
    """Save ``model`` (Llama/Qwen2/Qwen3 from transformers) as ``path``; 2-D weights in ``qtype``;
    ``rope_freqs`` (``[head_dim / 2]`` float32, llama.cpp's RoPE frequency factors) if given."""
    import gguf
    from gguf.quants import quantize

    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    writer.add_vocab_size(cfg.vocab_size)
    heads = {"q_proj": cfg.num_attention_heads, "k_proj": cfg.num_key_value_heads}
    qt = gguf.GGMLQuantizationType[qtype]
    for name, p in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue  # NOTE: llama.cpp omits output.weight when the head is tied
        w = p.detach().float().numpy()
        proj = name.split(".")[-2]
        if arch == "llama" and proj in heads and name.endswith("weight"):
            w = permute(w, heads[proj])
        if w.ndim == 2 and qtype != "F32":
            writer.add_tensor(gguf_name(name), quantize(w, qt), raw_dtype=qt)
        else:
            writer.add_tensor(gguf_name(name), np.ascontiguousarray(w))
    if rope_freqs is not None:
        writer.add_tensor("rope_freqs.weight", rope_freqs.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path

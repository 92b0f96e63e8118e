"""A tiny gpt-oss checkpoint in the Hub's MXFP4 form, made from a random transformers model.

The experts' fused weights are quantized here (the inverse of transformers'
``convert_moe_packed_tensors``): per 32 values along the contraction dim one e8m0 exponent
(``ceil(log2(amax / 6))``, bias 127) and the nearest e2m1 value of each, two a byte, the low
nibble first; written under the Hub's names (``experts.gate_up_proj_blocks`` ``[E, 2 I, H / 32,
16]`` uint8, ``..._scales`` ``[E, 2 I, H / 32]``, ``down_proj_*`` ``[E, H, I / 32, ...]``) with
``quantization_config: {"quant_method": "mxfp4", ...}``. The other tensors stay as saved (fp32).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from graphrt.checkpoints.mxfp4 import BLOCK, FP4_VALUES, SCALE_BIAS
from tests.support.hf_util import SMALL, save_checkpoint

#: gpt-oss-20b's ``quantization_config`` (what the Hub's config.json holds).
QUANTIZATION_CONFIG = {
    "quant_method": "mxfp4",
    "modules_to_not_convert": [
        "model.layers.*.self_attn",
        "model.layers.*.mlp.router",
        "model.embed_tokens",
        "lm_head",
    ],
}
#: The tiny gpt-oss (sinks, sliding layers, YaRN, 4 experts top-2): H 64, I 96 (2 and 3 blocks).
GPT_OSS = dict(
    **SMALL,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_local_experts=4,
    num_experts_per_tok=2,
    sliding_window=8,
)
EXPERTS = ("gate_up_proj", "down_proj")


def quantize_mxfp4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' ``[E, K, R]`` expert weight → MXFP4 ``blocks`` ``[E, R, K / 32, 16]`` uint8
    and ``scales`` ``[E, R, K / 32]`` uint8 (values of a row grouped along ``K``)."""
    rows = weight.transpose(1, 2).float()
    e, r, k = rows.shape
    groups = rows.reshape(e, r, k // BLOCK, BLOCK)
    amax = groups.abs().amax(-1)
    exp = torch.where(amax > 0, torch.ceil(torch.log2(amax / 6)), torch.full_like(amax, -SCALE_BIAS))
    exp = exp.clamp(-SCALE_BIAS, SCALE_BIAS)
    scaled = groups / torch.exp2(exp)[..., None]
    nibbles = (scaled[..., None] - torch.tensor(FP4_VALUES)).abs().argmin(-1).to(torch.uint8)
    blocks = nibbles[..., 0::2] | (nibbles[..., 1::2] << 4)
    return blocks.contiguous(), (exp + SCALE_BIAS).to(torch.uint8)


def save_mxfp4_checkpoint(path: Path, config: dict[str, Any] | None = None, seed: int = 0) -> None:
    """A random transformers ``GptOssForCausalLM(GptOssConfig(**config))`` saved at ``path``
    with its experts' weights in MXFP4 (biases, attention, router, embeddings as saved)."""
    import transformers
    from safetensors.torch import load_file, save_file

    cfg = transformers.GptOssConfig(**(config or GPT_OSS))
    save_checkpoint(path, transformers.GptOssForCausalLM, cfg, seed=seed)
    file = path / "model.safetensors"
    tensors = load_file(file)
    for name in [n for n in tensors if n.endswith(tuple(f"experts.{p}" for p in EXPERTS))]:
        tensors[f"{name}_blocks"], tensors[f"{name}_scales"] = quantize_mxfp4(tensors.pop(name))
    save_file(tensors, file, metadata={"format": "pt"})
    raw = json.loads((path / "config.json").read_text())
    raw["quantization_config"] = QUANTIZATION_CONFIG
    (path / "config.json").write_text(json.dumps(raw))


def mxfp4_reference(path: Path) -> Any:
    """transformers' own load of the MXFP4 checkpoint at ``path``, dequantized (fp32)."""
    import transformers

    return transformers.GptOssForCausalLM.from_pretrained(
        path, dtype=torch.float32, quantization_config=transformers.Mxfp4Config(dequantize=True)
    ).eval()

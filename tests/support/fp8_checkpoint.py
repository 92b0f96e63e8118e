"""Tiny FP8 checkpoints in the Hub's formats, made from a random transformers model.

Each projection weight (q/k/v/o, gate/up/down: compressed-tensors' ``targets: ["Linear"]``,
``ignore: ["lm_head"]``) is quantized with its format's math and written under its names:

- ``ct-channel``: compressed-tensors ``float-quantized``, ``strategy: channel``, dynamic
  per-token activations: ``weight`` e4m3 + ``weight_scale`` ``[N, 1]`` (``amax_row / 448``);
- ``ct-tensor``: ``strategy: tensor`` with static activations: ``weight_scale`` ``[1]`` and
  ``input_scale`` ``[1]``;
- ``block``: DeepSeek / Qwen3-FP8 ``quant_method: fp8``, ``weight_block_size`` :data:`BLOCK`,
  dynamic activations: ``weight_scale_inv`` ``[ceil(N / bn), ceil(K / bk)]`` (``amax_block / 448``).

The test block is ``[24, 40]`` (not DeepSeek's 128) so the tiny model's weights hold several
blocks each and partial ones at the edges.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from tests.support.hf_util import SMALL, save_checkpoint
from tests.support.moe_checkpoints import HEADS, MOE_CASES

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
BLOCK = (24, 40)
#: The projections quantized (DeepSeek's MLA ones too; routers and norms stay as saved).
PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PROJ += ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj")


def _ct_group(strategy: str, static: bool) -> dict[str, Any]:
    weights = {"num_bits": 8, "type": "float", "strategy": strategy, "symmetric": True, "dynamic": False}
    acts = {"num_bits": 8, "type": "float", "symmetric": True}
    acts |= {"strategy": "tensor", "dynamic": False} if static else {"strategy": "token", "dynamic": True}
    return {"targets": ["Linear"], "weights": weights | {"group_size": None, "block_structure": None},
            "input_activations": acts, "output_activations": None}  # fmt: skip


def _ct(strategy: str, static: bool) -> dict[str, Any]:
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "config_groups": {"group_0": _ct_group(strategy, static)},
        "ignore": ["lm_head"],
        "kv_cache_scheme": None,
    }


#: Format → its ``quantization_config``.
CONFIGS: dict[str, dict[str, Any]] = {
    "ct-channel": _ct("channel", static=False),
    "ct-tensor": _ct("tensor", static=True),
    "block": {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": list(BLOCK),
    },
}
#: Tiny models: a Llama (GQA), a Qwen3 (q/k norms), and two MoE families with FP8 experts.
MODELS = {
    "llama": ("LlamaForCausalLM", "LlamaConfig", HEADS),
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config", dict(**HEADS, head_dim=16)),
    "qwen3-moe": MOE_CASES["qwen3-moe-norm-topk"],
    "deepseek-v3": MOE_CASES["deepseek-v3-sigmoid-grouped"],
}


def _e4m3(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (w / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def quantize(w: torch.Tensor, fmt: str) -> dict[str, torch.Tensor]:
    """``w [N, K]`` in ``fmt``: suffix (``""`` for the weight) → stored tensor."""
    w = w.float()
    if fmt == "ct-channel":
        scale = w.abs().amax(1, keepdim=True) / FP8_MAX
        return {"": _e4m3(w, scale), "_scale": scale}
    if fmt == "ct-tensor":
        scale = (w.abs().amax() / FP8_MAX).reshape(1)
        return {"": _e4m3(w, scale), "_scale": scale, "input": torch.tensor([0.02])}
    (bn, bk), (n, k) = BLOCK, w.shape
    padded = torch.zeros(math.ceil(n / bn) * bn, math.ceil(k / bk) * bk)
    padded[:n, :k] = w
    blocks = padded.reshape(padded.shape[0] // bn, bn, padded.shape[1] // bk, bk)
    scale = blocks.abs().amax((1, 3)) / FP8_MAX
    full = scale.repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
    return {"": _e4m3(w, full), "_scale_inv": scale}


def dequantize(stored: dict[str, torch.Tensor], fmt: str) -> torch.Tensor:
    """The format's own dequantization of :func:`quantize`'s tensors (fp32)."""
    q = stored[""].float()
    if fmt != "block":
        return q * stored["_scale"].reshape(-1, 1)
    (bn, bk), (n, k) = BLOCK, q.shape
    return q * stored["_scale_inv"].repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]


def save_fp8_checkpoint(path: Path, fmt: str, model: str = "llama", seed: int = 0) -> dict[str, torch.Tensor]:
    """Save a random tiny ``model`` at ``path`` with its projections in ``fmt``; returns the
    dequantized state dict (fp32; what a dequantize-then-matmul reference loads)."""
    import transformers
    from safetensors.torch import load_file, save_file

    model_cls, config_cls, kwargs = MODELS[model]
    config = getattr(transformers, config_cls)(**SMALL, **kwargs)
    save_checkpoint(path, getattr(transformers, model_cls), config, seed=seed)
    file = path / "model.safetensors"
    tensors, dequantized = load_file(file), {}
    for name in [n for n in tensors if n.endswith(tuple(f"{p}.weight" for p in PROJ))]:
        stored = quantize(tensors.pop(name), fmt)
        dequantized[name] = dequantize(stored, fmt)
        for suffix, t in stored.items():
            key = name.removesuffix("weight") + "input_scale" if suffix == "input" else name + suffix
            tensors[key] = t.contiguous()
    save_file(tensors, file, metadata={"format": "pt"})
    raw = json.loads((path / "config.json").read_text())
    raw["quantization_config"] = CONFIGS[fmt]
    (path / "config.json").write_text(json.dumps(raw))
    kept = {n: t.float() for n, t in tensors.items() if not n.endswith(("_scale", "_scale_inv"))}
    return kept | dequantized


def reference(path: Path, state: dict[str, torch.Tensor], out: Path, model: str = "llama") -> Any:
    """transformers' fp32 model of ``state`` (the dequantized weights) saved at ``out`` with
    ``path``'s config less its quantization: the dequantize-then-matmul reference."""
    import transformers
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    raw = json.loads((path / "config.json").read_text())
    raw.pop("quantization_config")
    (out / "config.json").write_text(json.dumps(raw))
    save_file(
        {n: t.contiguous() for n, t in state.items()}, out / "model.safetensors", metadata={"format": "pt"}
    )
    return getattr(transformers, MODELS[model][0]).from_pretrained(out, dtype=torch.float32).eval()

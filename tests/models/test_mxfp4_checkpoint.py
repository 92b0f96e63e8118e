"""gpt-oss MXFP4 checkpoints: experts dequantized at load == transformers' dequantization.

A tiny random gpt-oss is saved by transformers and its experts quantized to MXFP4 under the
Hub's names (tests/support/mxfp4_checkpoint.py). Checked: the tensors graphrt's source
dequantizes equal transformers' ``convert_moe_packed_tensors`` of the same blocks and scales
exactly (every value is exact in fp32 and bf16); the loaded experts equal those transformers
loads with ``Mxfp4Config(dequantize=True)``; logits (eager and graphed) and greedy tokens equal
that model's (fp32 CPU 1e-4; bf16 CUDA as tests/models/test_models_hf.py); bad packed tensors and
other quantization methods are refused by name before anything is allocated.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from transformers.integrations.mxfp4 import convert_moe_packed_tensors  # noqa: E402

from graphrt.checkpoints import load, mxfp4  # noqa: E402
from graphrt.checkpoints.mxfp4 import dequantize  # noqa: E402
from graphrt.checkpoints.safetensors_dir import SafetensorsDir  # noqa: E402
from graphrt.models import CausalLM  # noqa: E402
from graphrt.models.parallel import whole  # noqa: E402
from tests.support.hf_util import check_checkpoint, check_greedy_generate, edited_copy  # noqa: E402
from tests.support.mxfp4_checkpoint import EXPERTS, mxfp4_reference, save_mxfp4_checkpoint  # noqa: E402

WEIGHTS = "model.safetensors"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    path = tmp_path_factory.mktemp("gpt-oss-mxfp4")
    save_mxfp4_checkpoint(path)
    return path, mxfp4_reference(path)


def _packed(path: Path) -> dict[str, torch.Tensor]:
    return safetensors_torch.load_file(path / WEIGHTS)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dequantized_equal_transformers(
    device: torch.device, checkpoint: tuple[Path, Any], dtype: torch.dtype
) -> None:
    """The source lists each packed pair as transformers' parameter (``[E, H, 2 I]``, ``[E, I,
    H]``) and reads it as ``convert_moe_packed_tensors`` dequantizes it, on ``device``."""
    path, reference = checkpoint
    stored, source = _packed(path), SafetensorsDir(path, dtype)
    shapes = source.shapes()
    assert not any(n.endswith(("_blocks", "_scales")) for n in shapes)
    for i in range(reference.config.num_hidden_layers):
        experts = reference.model.layers[i].mlp.experts
        for proj in EXPERTS:
            name = f"model.layers.{i}.mlp.experts.{proj}"
            assert shapes[name] == tuple(getattr(experts, proj).shape)
            blocks, scales = (stored[f"{name}{s}"].to(device) for s in ("_blocks", "_scales"))
            want = convert_moe_packed_tensors(blocks, scales, dtype=dtype)
            got = source.read(name, device, whole(shapes[name]))
            assert got.dtype == dtype and got.device.type == device.type
            assert torch.equal(got, want), name


def test_dequantize_every_code_and_scale() -> None:
    """All 256 byte values under scales from 2**-127 to 2**127 (zero, the extremes, subnormal
    fp32 results) == transformers' dequantization."""
    codes = torch.arange(256, dtype=torch.uint8).reshape(16, 1, 16).expand(16, 16, 16)
    blocks = codes.reshape(1, 16, 16, 16).repeat(3, 1, 1, 1).contiguous()
    scales = torch.tensor([0, 1, 100, 127, 140, 254], dtype=torch.uint8)
    scales = scales.repeat_interleave(128)[: 3 * 16 * 16].reshape(3, 16, 16)
    for dtype in (torch.float32, torch.bfloat16):
        want = convert_moe_packed_tensors(blocks, scales, dtype=dtype)
        assert torch.equal(dequantize(blocks, scales, dtype).transpose(1, 2), want)


def test_loaded_experts_equal_transformers_dequantized(checkpoint: tuple[Path, Any]) -> None:
    """``load(dir)``'s ``w13`` (gate rows then up rows) and ``w2`` == transformers' dequantized
    ``gate_up_proj`` (gate and up interleaved) and ``down_proj``, exactly; biases as saved."""
    path, reference = checkpoint
    model = load(path, device="cpu")
    for ours, theirs in zip(model.layers, reference.model.layers, strict=True):
        experts = theirs.mlp.experts
        gate_up = experts.gate_up_proj.detach()
        w13 = torch.cat((gate_up[..., 0::2], gate_up[..., 1::2]), dim=-1).transpose(1, 2)
        assert torch.equal(ours.mlp.experts.w13, w13)
        assert torch.equal(ours.mlp.experts.w2, experts.down_proj.detach().transpose(1, 2))
        bias = experts.gate_up_proj_bias.detach()
        assert torch.equal(ours.mlp.experts.b13, torch.cat((bias[..., 0::2], bias[..., 1::2]), dim=-1))


def test_dequantized_one_tensor_at_a_time(
    checkpoint: tuple[Path, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Listing the tensors dequantizes nothing; loading dequantizes each layer's projection once,
    tensor by tensor as it is copied in (never the whole checkpoint's experts together)."""
    calls: list[tuple[int, ...]] = []

    def spy(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        calls.append(tuple(blocks.shape))
        return dequantize(blocks, scales, dtype)

    monkeypatch.setattr(mxfp4, "dequantize", spy)
    path, reference = checkpoint
    SafetensorsDir(path).shapes()
    assert calls == []
    load(path, device="cpu")
    cfg = reference.config
    h, i = cfg.hidden_size, cfg.intermediate_size
    per_layer = [(cfg.num_local_experts, 2 * i, h // 32, 16), (cfg.num_local_experts, h, i // 32, 16)]
    assert sorted(calls) == sorted(per_layer * cfg.num_hidden_layers)


def test_logits_equal_transformers(device: torch.device, checkpoint: tuple[Path, Any]) -> None:
    check_checkpoint(device, *checkpoint)


@torch.no_grad()
def test_greedy_tokens_equal_transformers_generate(checkpoint: tuple[Path, Any]) -> None:
    """``Engine(dir)`` (graphed DECODE, fp32 CPU) == transformers' greedy ``generate`` on its
    own dequantization of the same checkpoint; a batch gives each prompt its tokens alone."""
    check_greedy_generate(*checkpoint)


def _edited(path: Path, tmp: Path, config: Callable[[dict], None] | None, tensors: Callable | None) -> Path:
    return edited_copy(path, tmp / "ckpt", config, tensors)


L0 = "model.layers.0"
REFUSED: dict[str, tuple[Callable | None, Callable | None, str]] = {
    "other-method": (
        lambda raw: raw["quantization_config"].update(quant_method="awq"),
        None,
        r"quantization 'awq' is not supported for GptOssForCausalLM .*dequantized at load: mxfp4 for GptOssForCausalLM",
    ),
    "mxfp4-not-gpt-oss": (
        lambda raw: raw.update(architectures=["MixtralForCausalLM"]),
        None,
        r"quantization 'mxfp4' is not supported for MixtralForCausalLM safetensors checkpoints",
    ),
    "no-scales": (
        None,
        lambda s: s.pop(f"{L0}.mlp.experts.down_proj_scales"),
        rf"MXFP4 tensor '{L0}.mlp.experts.down_proj_blocks' has no '{L0}.mlp.experts.down_proj_scales'",
    ),
    "scale-shape": (
        None,
        lambda s: s.update(
            {
                f"{L0}.mlp.experts.gate_up_proj_scales": s[f"{L0}.mlp.experts.gate_up_proj_scales"][
                    :, :-1
                ].contiguous()
            }
        ),
        rf"MXFP4 tensor '{L0}.mlp.experts.gate_up_proj_blocks' has shape \[4, 192, 2, 16\]",
    ),
    "blocks-dtype": (
        None,
        lambda s: s.update(
            {f"{L0}.mlp.experts.down_proj_blocks": s[f"{L0}.mlp.experts.down_proj_blocks"].to(torch.int8)}
        ),
        r"dtypes I8 / U8, want U8",
    ),
    "both-forms": (
        None,
        lambda s: s.update({f"{L0}.mlp.experts.down_proj": torch.zeros(4, 96, 64)}),
        rf"tensor '{L0}.mlp.experts.down_proj' is stored both as it is and as MXFP4 '{L0}.mlp.experts.down_proj_blocks'",
    ),
    "packed-attention": (
        None,
        lambda s: s.update(
            {f"{L0}.self_attn.o_proj.weight_blocks": torch.zeros(64, 2, 16, dtype=torch.uint8)}
        ),
        rf"tensor '{L0}.self_attn.o_proj.weight_blocks' has dtype U8: quantised safetensors are not supported",
    ),
    "wrong-experts": (
        lambda raw: raw.update(num_local_experts=8),
        None,
        rf"tensor '{L0}.mlp.experts.gate_up_proj': expected shape \[8, 64, 192\] from the config, found \[4, 64, 192\]",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_bad_mxfp4_checkpoint_refused(
    checkpoint: tuple[Path, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """Refused with a message naming the method or tensor, before the model is allocated."""
    config, tensors, message = REFUSED[case]
    monkeypatch.setattr(CausalLM, "to_empty", lambda *a, **k: pytest.fail("allocated before the check"))
    with pytest.raises(ValueError, match=message):
        load(_edited(checkpoint[0], tmp_path, config, tensors), device="cpu")

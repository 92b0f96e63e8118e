"""FP8 weight checkpoints: compressed-tensors ``float-quantized`` (per-channel scales with
dynamic activations, per-tensor scales with static ``input_scale``) and ``fp8`` 128x128-style
block scales (DeepSeek-V3, Qwen3-FP8), written here from tiny random transformers models with
each format's math and names (tests/support/fp8_checkpoint.py).

Checked: the projections load as graphrt's FP8 weight (e4m3 + float32 per-row scale) and
dequantize to the format's dequantization (channel / tensor: exactly; block: requantized per row
within one e4m3 rounding, ``|dW| <= 2**-4 |W| + 2**-10 s_row``); logits (prefill, decode eager
and graphed; fp32 CPU, 1e-4) equal transformers on the dequantized weights; greedy tokens equal
transformers' ``generate``; MoE experts dequantized to the model dtype; ``quantization="fp8"``
on an FP8 checkpoint changes nothing; unsupported schemes refused by name before allocating.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from graphrt import Engine  # noqa: E402
from graphrt.checkpoints import load  # noqa: E402
from graphrt.checkpoints.checkpoint import CheckpointError, materialize  # noqa: E402
from graphrt.checkpoints.safetensors_dir import SafetensorsDir  # noqa: E402
from graphrt.kernels import fp8_gemm  # noqa: E402
from graphrt.models import CausalLM  # noqa: E402
from graphrt.models.quantize import quantize  # noqa: E402
from tests.support.fp8_checkpoint import FP8, reference, save_fp8_checkpoint  # noqa: E402
from tests.support.hf_util import (  # noqa: E402
    PROMPT_LENS,
    assert_parity,
    check_checkpoint,
    edited_copy,
    reference_logits,
    run_graphrt,
    sequences,
)

#: Largest logit difference block scales requantized per row may make against the format's own
#: dequantization in the tiny Llama (logits up to ~3.6): the requantization is a second e4m3
#: rounding, which moves these logits by 0.20 at most, as much as the block FP8 itself (0.19).
BLOCK_LOGITS = 0.3
#: graphrt's fused projections: parameter → the checkpoint projections in it, in row order.
FUSED = {
    "attn.qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "attn.o": ("self_attn.o_proj",),
    "mlp.gate_up": ("mlp.gate_proj", "mlp.up_proj"),
    "mlp.down": ("mlp.down_proj",),
}


@pytest.fixture(scope="module", params=[("ct-channel", "llama"), ("ct-tensor", "qwen3"), ("block", "llama")])
def checkpoint(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict, str]:
    fmt, model = request.param
    path = tmp_path_factory.mktemp(f"{fmt}-{model}")
    return path, save_fp8_checkpoint(path / "fp8", fmt, model), fmt


def _format_weights(model: CausalLM, state: dict[str, torch.Tensor], layer: int, param: str) -> torch.Tensor:
    return torch.cat([state[f"model.layers.{layer}.{p}.weight"] for p in FUSED[param]])


def test_loaded_weights_dequantize_to_the_format(checkpoint: tuple[Path, dict, str]) -> None:
    """Every projection is e4m3 with float32 per-row scales; ``q * s`` is the format's ``W``
    (exact for channel and tensor scales; within one e4m3 rounding of ``W`` for block scales)."""
    path, state, fmt = checkpoint
    model = load(path / "fp8", device="cpu")
    worst = 0.0
    for i, block in enumerate(model.layers):
        for param in FUSED:
            layer = block.get_submodule(param)
            assert layer.weight.dtype == FP8 and layer.weight_scale.dtype == torch.float32
            assert "weight_scale" in layer._buffers  # NOTE: the representation quantize_fp8 leaves
            got, want = (
                fp8_gemm.dequantize(layer.weight, layer.weight_scale),
                _format_weights(model, state, i, param),
            )
            if fmt != "block":
                assert torch.equal(got, want), (i, param)
                continue
            bound = 2**-4 * want.abs() + 2**-10 * layer.weight_scale[:, None]
            assert ((got - want).abs() <= bound).all(), (i, param)
            worst = max(worst, ((got - want).abs() / want.abs().amax(1, keepdim=True)).max().item())
    assert fmt != "block" or 0 < worst <= 2**-4  # NOTE: requantizing does change some values


def test_logits_equal_the_dequantized_reference(checkpoint: tuple[Path, dict, str]) -> None:
    """graphrt (FP8 weights, the CPU reference path; prefill, decode eager and graphed) ==
    transformers on the weights graphrt holds, dequantized (fp32, 1e-4). For block scales those
    are the per-row requantization; transformers on the format's own dequantization is then
    within :data:`BLOCK_LOGITS` (the requantization's cost in logits)."""
    path, state, fmt = checkpoint
    name = json.loads((path / "fp8" / "config.json").read_text())["architectures"][0]
    model = "qwen3" if name.startswith("Qwen3") else "llama"
    if fmt != "block":
        check_checkpoint(
            torch.device("cpu"), path / "fp8", reference(path / "fp8", state, path / "ref", model)
        )
        return
    loaded, source, held = _held_reference(path / "fp8", state, path / "held", model)
    assert source.held == set(source.fp8)  # NOTE: a dense model holds every projection in FP8
    own = reference(path / "fp8", state, path / "ref", model)
    seqs = sequences(own.config.vocab_size)
    run = run_graphrt(loaded, seqs)
    assert_parity(run, reference_logits(held, seqs), atol=1e-4, rtol=1e-4)
    assert_parity(run, reference_logits(own, seqs), atol=BLOCK_LOGITS, rtol=0)


def _held_reference(
    path: Path, state: dict[str, torch.Tensor], out: Path, model: str
) -> tuple[Any, SafetensorsDir, Any]:
    """graphrt's load of ``path`` and transformers on the weights it holds: FP8-held projections
    as their per-row requantization, every other weight as the format dequantizes it."""
    source = SafetensorsDir(path)
    loaded = materialize(source, torch.device("cpu"), torch.float32)
    block = source.fp8_scheme is not None and source.fp8_scheme.strategy == "block"
    held = {n: fp8_gemm.dequantize(*fp8_gemm.quantize(state[n])) for n in source.held} if block else {}
    return loaded, source, reference(path, state | held, out, model)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
def test_logits_on_the_gpu(checkpoint: tuple[Path, dict, str]) -> None:
    """bf16 on CUDA (the FP8 skinny GEMM at decode): logits within tests/support/hf_util's bf16
    tolerance of transformers (fp32) on the weights graphrt holds, dequantized."""
    path, state, _ = checkpoint
    name = json.loads((path / "fp8" / "config.json").read_text())["architectures"][0]
    _, _, held = _held_reference(
        path / "fp8", state, path / "gpu-ref", "qwen3" if "Qwen3" in name else "llama"
    )
    check_checkpoint(torch.device("cuda"), path / "fp8", held)


@pytest.mark.parametrize("model", ["qwen3-moe", "deepseek-v3"])
def test_moe_experts_dequantized_at_load(model: str, tmp_path: Path) -> None:
    """Qwen3-MoE-FP8 / DeepSeek-V3 style block FP8: attention (Qwen3) and dense or shared-expert
    MLPs stay FP8, routed experts (and MLA projections) are dequantized to the model dtype; the
    logits equal transformers on those weights (fp32, 1e-4)."""
    state = save_fp8_checkpoint(tmp_path / "fp8", "block", model)
    loaded, source, ref = _held_reference(tmp_path / "fp8", state, tmp_path / "ref", model)
    assert source.held and source.held < set(source.fp8)
    assert all(".experts." not in n for n in source.held) and any(".experts." in n for n in source.fp8)
    experts = loaded.layers[1].mlp.experts
    assert experts.w13.dtype == experts.w2.dtype == torch.float32
    fp8 = [n for n, p in loaded.named_parameters() if p.dtype == FP8]
    assert fp8 and not any("experts" in n for n in fp8)
    seqs = sequences(ref.config.vocab_size)
    assert_parity(run_graphrt(loaded, seqs), reference_logits(ref, seqs), atol=1e-4, rtol=1e-4)


@torch.no_grad()
def test_greedy_tokens_equal_transformers_generate(tmp_path: Path) -> None:
    """``Engine(dir)`` (graphed DECODE, fp32 CPU) on a compressed-tensors FP8 checkpoint ==
    transformers' greedy ``generate`` on the dequantized weights; a batch == each prompt alone."""
    state = save_fp8_checkpoint(tmp_path / "fp8", "ct-channel", "qwen3")
    ref = reference(tmp_path / "fp8", state, tmp_path / "ref", "qwen3")
    seqs, new = sequences(ref.config.vocab_size, seed=1), 8
    prompts = [s[:n] for s, n in zip(seqs, PROMPT_LENS, strict=True)]
    engine = Engine(
        str(tmp_path / "fp8"), device="cpu", max_batch_size=4, max_context_len=64, buckets=(1, 2, 4)
    )
    ours = engine.generate(prompts, new)
    assert engine.stats().replays["DECODE"] > 0
    assert [engine.generate([p], new)[0] for p in prompts] == ours
    for prompt, got in zip(prompts, ours, strict=True):
        want = ref.generate(torch.tensor([prompt]), max_new_tokens=new, do_sample=False, pad_token_id=0)
        assert got == want[0, len(prompt) :].tolist()


def test_quantization_fp8_on_an_fp8_checkpoint_changes_nothing(checkpoint: tuple[Path, dict, str]) -> None:
    """``quantization="fp8"`` leaves the checkpoint's FP8 weights as loaded (no second rounding)."""
    path = checkpoint[0] / "fp8"
    plain, again = load(path, device="cpu"), load(path, device="cpu", quantization="fp8")
    assert quantize(plain, "fp8") == 0
    for (name, a), (_, b) in zip(plain.state_dict().items(), again.state_dict().items(), strict=True):
        assert a.dtype == b.dtype and torch.equal(a.float(), b.float()), name


def _edited(path: Path, tmp: Path, config: Callable[[dict], None] | None, tensors: Callable | None) -> Path:
    return edited_copy(path, tmp / "edited", config, tensors)


def _weights(**changes: Any) -> Callable[[dict], None]:
    return lambda raw: raw["quantization_config"]["config_groups"]["group_0"]["weights"].update(changes)


Q0 = "model.layers.0.self_attn.q_proj"
#: case → (checkpoint format, config edit, tensors edit, message).
REFUSED: dict[str, tuple[str, Callable | None, Callable | None, str]] = {
    "other-method": (
        "ct-channel",
        lambda raw: raw["quantization_config"].update(quant_method="awq"),
        None,
        r"quantization 'awq' is not supported for LlamaForCausalLM .*FP8 checkpoints load",
    ),
    "ct-int8": (
        "ct-channel",
        _weights(type="int"),
        None,
        r"'compressed-tensors' with config_groups.group_0: weights num_bits 8 type int",
    ),
    "ct-int4": ("ct-channel", _weights(num_bits=4, type="int"), None, r"weights num_bits 4 type int"),
    "ct-group": ("ct-channel", _weights(strategy="group", group_size=32), None, r"weights strategy 'group'"),
    "ct-block": ("ct-channel", _weights(strategy="block"), None, r"weights strategy 'block'"),
    "ct-pack-quantized": (
        "ct-channel",
        lambda raw: raw["quantization_config"].update(format="pack-quantized"),
        None,
        r"'compressed-tensors' with format 'pack-quantized'",
    ),
    "fp8-e5m2": (
        "block",
        lambda raw: raw["quantization_config"].update(fmt="e5m2"),
        None,
        r"quantization 'fp8' with fmt 'e5m2'",
    ),
    "no-scale": (
        "block",
        None,
        lambda s: s.pop(f"{Q0}.weight_scale_inv"),
        rf"FP8 weight '{Q0}.weight' has no '{Q0}.weight_scale_inv'",
    ),
    "scale-shape": (
        "ct-channel",
        None,
        lambda s: s.update({f"{Q0}.weight_scale": s[f"{Q0}.weight_scale"][:-1].contiguous()}),
        rf"'{Q0}.weight_scale' has shape \[63, 1\], want \[64, 1\] or \[64\]",
    ),
    "block-scale-shape": (
        "block",
        None,
        lambda s: s.update({f"{Q0}.weight_scale_inv": s[f"{Q0}.weight_scale_inv"][:, :-1].contiguous()}),
        rf"'{Q0}.weight_scale_inv' has shape \[3, 1\], want \[3, 2\]",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_unsupported_fp8_refused(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Refused with a message naming the scheme or tensor, before the model is allocated."""
    fmt, config, tensors, message = REFUSED[case]
    save_fp8_checkpoint(tmp_path / "fp8", fmt)
    monkeypatch.setattr(CausalLM, "to_empty", lambda *a, **k: pytest.fail("allocated before the check"))
    with pytest.raises(ValueError, match=message):
        load(_edited(tmp_path / "fp8", tmp_path, config, tensors), device="cpu")


def test_non_finite_scale_refused(tmp_path: Path) -> None:
    """A scale that is NaN or infinite is refused naming it (it would turn every logit to NaN)."""
    save_fp8_checkpoint(tmp_path / "fp8", "ct-channel")

    def nan(state: dict) -> None:
        state[f"{Q0}.weight_scale"][3] = float("nan")

    with pytest.raises(
        CheckpointError, match=rf"FP8 scale '{Q0}.weight_scale' holds a value that is not finite"
    ):
        load(_edited(tmp_path / "fp8", tmp_path, None, nan), device="cpu")


@pytest.mark.slow  # NOTE: two spawned ranks, ~75 s on a loaded 2-core box
def test_tp2_matches_tp1(tmp_path: Path) -> None:
    """Two CPU ranks (gloo, fp32): column shards keep their rows' scales, row shards every row's
    (block scales requantized over the whole row before the columns are cut); logits within
    1e-4 of TP=1 and the same greedy tokens (tests/parallel/test_tp_checkpoints.py's check)."""
    from tests.parallel.test_tp_checkpoints import ATOL, checkpoint_parity
    from tests.support.tp_util import run_ranks

    paths = {}
    for fmt in ("ct-channel", "block"):
        save_fp8_checkpoint(tmp_path / fmt, fmt)
        paths[fmt] = str(tmp_path / fmt)
    for rank, found in enumerate(run_ranks(checkpoint_parity, 2, paths, deadline_s=420)):
        for fmt, (diff, same, _, _) in found.items():
            assert diff <= ATOL and same, (rank, fmt, diff)

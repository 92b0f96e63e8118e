"""Bad checkpoints fail with an error naming the problem, before anything is allocated on the device."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from graphrt.checkpoints import gguf_file as gguf_module  # noqa: E402
from graphrt.checkpoints import load  # noqa: E402
from graphrt.models import CausalLM  # noqa: E402
from tests.support.hf_util import SMALL, randomize, save_checkpoint  # noqa: E402

WEIGHTS = "model.safetensors"


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("good")
    config = transformers.LlamaConfig(**SMALL, num_attention_heads=4, num_key_value_heads=2)
    save_checkpoint(path, transformers.LlamaForCausalLM, config)
    return path


@pytest.fixture(autouse=True)
def no_allocation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every error below must come before the model is materialised on the device."""

    def refuse(self: CausalLM, *, device: torch.device) -> CausalLM:
        raise AssertionError("allocated on the device before the checkpoint was checked")

    monkeypatch.setattr(CausalLM, "to_empty", refuse)


def edited(good: Path, tmp_path: Path, config: Callable[[dict], None] | None = None, tensors=None) -> Path:
    """A copy of ``good`` with ``config(raw)`` and ``tensors(state)`` applied in place."""
    path = tmp_path / "ckpt"
    shutil.copytree(good, path)
    if config is not None:
        raw = json.loads((path / "config.json").read_text())
        config(raw)
        (path / "config.json").write_text(json.dumps(raw))
    if tensors is not None:
        state = safetensors_torch.load_file(path / WEIGHTS)
        tensors(state)
        safetensors_torch.save_file(state, path / WEIGHTS)
    return path


CASES: dict[str, tuple[dict, str]] = {
    "architecture": (
        dict(config=lambda raw: raw.update(architectures=["GPT2LMHeadModel"])),
        r"unsupported architecture GPT2LMHeadModel; supported: LlamaForCausalLM, MistralForCausalLM, "
        r"Qwen2ForCausalLM, Qwen3ForCausalLM",
    ),
    "missing": (
        dict(tensors=lambda s: s.pop("model.layers.1.mlp.up_proj.weight")),
        r"missing tensor 'model.layers.1.mlp.up_proj.weight'",
    ),
    "unexpected": (
        dict(tensors=lambda s: s.update({"model.layers.0.extra.weight": torch.zeros(2)})),
        r"unexpected tensor 'model.layers.0.extra.weight'",
    ),
    "shape": (
        dict(config=lambda raw: raw.update(intermediate_size=128)),
        r"tensor 'model.layers.0.mlp.gate_proj.weight': expected shape \[128, 64\] from the config, found \[96, 64\]",
    ),
    "int8": (
        dict(tensors=lambda s: s.update({"lm_head.weight": s["lm_head.weight"].to(torch.int8)})),
        r"tensor 'lm_head.weight' has dtype I8: quantised safetensors are not supported",
    ),
    "quantization_config": (
        dict(config=lambda raw: raw.update(quantization_config={"quant_method": "awq"})),
        r"quantization 'awq' is not supported",
    ),
    "dynamic-rope": (
        dict(config=lambda raw: raw.update(rope_parameters={"rope_type": "dynamic", "factor": 2.0})),
        r"rope_type 'dynamic' .* cannot be captured",
    ),
    "longrope": (
        dict(config=lambda raw: raw.update(rope_scaling={"type": "longrope"})),
        r"rope_type 'longrope' .* cannot be captured",
    ),
    "unknown": (
        dict(config=lambda raw: raw.update(rope_parameters={"rope_type": "made-up", "factor": 2.0})),
        r"rope_type 'made-up' is not supported; supported: default, linear, llama3",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_checkpoint_named_before_allocation(good: Path, tmp_path: Path, case: str) -> None:
    edits, message = CASES[case]
    with pytest.raises(ValueError, match=message):
        load(edited(good, tmp_path, **edits), device="cpu")


def test_gguf_quant_type_not_supported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("gguf")
    from tests.support.gguf_util import write_gguf

    model = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(**SMALL, num_attention_heads=4, num_key_value_heads=2)
    )
    randomize(model, seed=0)
    path = write_gguf(tmp_path / "m.gguf", model, "llama", "Q8_0")
    monkeypatch.setattr(gguf_module, "SUPPORTED_TYPES", ("F32", "F16"))
    with pytest.raises(ValueError, match=r"tensor '.*' is Q8_0: quantisation type not supported"):
        load(path, device="cpu")


def test_not_a_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not a checkpoint directory"):
        load(tmp_path / "nothing-here", device="cpu")

"""KV scales from a Hugging Face checkpoint (``self_attn.k_scale`` / ``v_scale`` / ``kv_scale``):
read, checked before anything is allocated, and handed to an FP8 cache."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from graphrt import RuntimeConfig
from graphrt.checkpoints.checkpoint import CheckpointError
from graphrt.checkpoints.loader import load
from graphrt.engine.stack import build_stack
from graphrt.models.causal_lm import CausalLM
from tests.support.hf_util import SMALL, save_checkpoint

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")
WEIGHTS = "model.safetensors"
LAYERS = SMALL["num_hidden_layers"]


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("plain")
    config = transformers.LlamaConfig(**SMALL, num_attention_heads=4, num_key_value_heads=2)
    save_checkpoint(path, transformers.LlamaForCausalLM, config)
    return path


def with_tensors(plain: Path, tmp_path: Path, add: Callable[[dict], None]) -> Path:
    path = tmp_path / "ckpt"
    shutil.copytree(plain, path)
    state = safetensors_torch.load_file(path / WEIGHTS)
    add(state)
    safetensors_torch.save_file(state, path / WEIGHTS)
    return path


def per_layer(key: str, values: list[float], shape: tuple[int, ...] = ()) -> Callable[[dict], None]:
    def add(state: dict) -> None:
        for i, value in enumerate(values):
            state[f"model.layers.{i}.self_attn.{key}"] = torch.full(shape, value)

    return add


def test_k_and_v_scales_reach_the_fp8_cache(plain: Path, tmp_path: Path) -> None:
    def add(state: dict) -> None:
        per_layer("k_scale", [0.5, 0.25])(state)
        per_layer("v_scale", [2.0, 0.125], (1,))(state)

    path = with_tensors(plain, tmp_path, add)
    model = load(path, device="cpu", dtype=torch.float32)
    assert (
        model.kv_scales is not None and model.kv_scales.k == (0.5, 0.25) and model.kv_scales.v == (2.0, 0.125)
    )
    config = RuntimeConfig(max_batch_size=2, max_context_len=32, page_size=16, capture_modes=())
    stack = build_stack(str(path), torch.device("cpu"), config, kv_cache_dtype="fp8_e4m3")
    assert stack.kv.k_scale.tolist() == [0.5, 0.25] and stack.kv.v_scale.tolist() == [2.0, 0.125]
    assert build_stack(str(path), torch.device("cpu"), config).kv.k_scale is None  # NOTE: unused by bf16/fp32


def test_one_kv_scale_serves_both_and_none_means_one(plain: Path, tmp_path: Path) -> None:
    path = with_tensors(plain, tmp_path, per_layer("kv_scale", [0.75, 3.0]))
    scales = load(path, device="cpu", dtype=torch.float32).kv_scales
    assert scales is not None and scales.k == scales.v == (0.75, 3.0)
    assert load(plain, device="cpu", dtype=torch.float32).kv_scales is None
    config = RuntimeConfig(max_batch_size=2, max_context_len=32, page_size=16, capture_modes=())
    kv = build_stack(str(plain), torch.device("cpu"), config, kv_cache_dtype="fp8_e4m3").kv
    assert kv.k_scale.tolist() == kv.v_scale.tolist() == [1.0] * LAYERS


BAD = {
    "missing": (per_layer("k_scale", [0.5, 0.5]), r"has KV scales but not layer 0 v_scale"),
    "per head": (per_layer("kv_scale", [1.0, 1.0], (2,)), r"a KV scale holds one value, found shape \[2\]"),
    "negative": (
        per_layer("kv_scale", [1.0, -1.0]),
        r"layer 1: k_scale must be a finite number > 0, got -1.0",
    ),
    "extra layer": (
        per_layer("kv_scale", [1.0] * (LAYERS + 1)),
        rf"unexpected tensor 'model.layers.{LAYERS}",
    ),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_scales_are_refused_before_allocating(
    plain: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    add, match = BAD[case]
    path = with_tensors(plain, tmp_path, add)

    def refuse(self: CausalLM, *, device: torch.device) -> CausalLM:
        raise AssertionError("allocated on the device before the scales were checked")

    monkeypatch.setattr(CausalLM, "to_empty", refuse)
    with pytest.raises(CheckpointError, match=match):
        load(path, device="cpu", dtype=torch.float32)


def test_fp8_stack_of_a_checkpoint_stays_close(plain: Path) -> None:
    """The same prompt through an FP8 and an fp32 cache: close logits, the same top token."""
    from graphrt import Batch, ForwardMode

    config = RuntimeConfig(max_batch_size=1, max_context_len=32, page_size=16, capture_modes=())
    logits = []
    for kv in ("auto", "fp8_e4m3"):
        stack = build_stack(str(plain), torch.device("cpu"), config, kv_cache_dtype=kv)
        ids = np.arange(1, 20) % SMALL["vocab_size"]
        batch = Batch.create(
            ForwardMode.EXTEND,
            input_ids=ids,
            seq_lens=[19],
            req_pool_indices=[0],
            out_cache_loc=np.arange(19),
            q_lens=[19],
        )
        logits.append(stack.runtime.run(batch))
    err = ((logits[1] - logits[0]).norm() / logits[0].norm()).item()
    assert 0 < err < 0.1 and torch.equal(logits[1][-1].argmax(), logits[0][-1].argmax())

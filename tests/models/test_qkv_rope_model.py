"""The qkv epilogue inside the models (``GRAPHRT_QKV_ROPE``): single-token decode steps with it on
against the same steps with it off (the norm GEMM, then ``rope_store``).

With it on, a layer whose context gives a slot (:meth:`ForwardContext.kv_slot`) rotates and stores
in the projection (``qkv_rope_gemm``) and the context only attends; q and the caches are the
two launches' bits, so the logits and every layer's cache are equal, not close. Which layers fuse:
GQA, a qkv bias, sliding-window layers; not q/k-norm (Qwen3), an FP8 cache, chunked-local layers,
nor steps of more than one token.

On the CPU the kernels run through Triton's interpreter (eager, and the fused op through the
emulated engine's graph; the unfused path's ``rope_store`` is a plain Triton launch, so it runs
eager). On the GPU (``-m gpu``) two runtimes of the same weights, each captured under its switch,
run the same graphed steps (bs 1, and bs 3 in bucket 4, which keeps the two launches) on every
backend, Llama-3.2-1B's layer shapes included, with PDL.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from graphrt.kv import rope_store as rs
from graphrt.models import qkv_rope as qr
from tests.models.test_prologue_model import build, kernels_on, step_batch  # noqa: F401 (a fixture)
from tests.triton_util import triton_devices
from tests.util import backends

#: Cases of test_prologue_model whose every layer fuses, and how many layers fuse in the others.
ALL_FUSE = ("tiny-llama", "qwen2-bias-tied", "tiny-llama-swa")
SOME_FUSE = {"qwen3-qk-norm": 0, "tiny-sinks-fp8-kv": 0, "tiny-llama-local": 1}


def counts(setup, bucket: int = 1) -> Counter:
    """Launches of the bucket's DECODE graph by kernel (op) name."""
    from graphrt import ForwardMode

    info = setup.runtime.dispatcher.graphs[(ForwardMode.DECODE, bucket)].info
    return Counter({k.name: k.count for k in info.kernels})


def caches(setup) -> list[torch.Tensor]:
    return [t.clone() for t in (*setup.kv.k, *setup.kv.v)]


def restore(setup, saved: list[torch.Tensor]) -> None:
    for t, c in zip((*setup.kv.k, *setup.kv.v), saved, strict=True):
        t.copy_(c)


def assert_same(a: list[torch.Tensor], b: list[torch.Tensor], what: str) -> None:
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True)), f"{what}: the caches differ"


@pytest.mark.parametrize("device", triton_devices())
@pytest.mark.parametrize("case", ALL_FUSE)
def test_epilogue_steps_equal_the_two_launches(device, kernels_on, case, monkeypatch) -> None:  # noqa: F811
    """Per step: off (eager), on (eager) and the graph captured on: equal logits and caches."""
    monkeypatch.setenv(qr.ENV, kernels_on)
    monkeypatch.setenv(rs.ENV, kernels_on)  # NOTE: the interpreter's rope_store rounds as the epilogue
    setup = build(device, case, record_kernels=True)
    layers = setup.model.cfg.num_layers
    got = counts(setup)
    assert got["qkv_rope_gemm"] == layers and got["prologue_norm_gemm"] == layers + 1, got
    token = 7
    for step in range(2):
        batch = step_batch(setup, [token], 34 + step)
        before = caches(setup)
        monkeypatch.setenv(qr.ENV, "0")
        off = setup.runtime.run(batch, eager=True)
        off_kv = caches(setup)
        monkeypatch.setenv(qr.ENV, kernels_on)
        restore(setup, before)  # NOTE: so a path that stored nothing would differ
        on = setup.runtime.run(batch, eager=True)
        assert torch.equal(on, off), f"step {step}: the logits differ"
        assert_same(caches(setup), off_kv, f"step {step} eager")
        restore(setup, before)
        assert torch.equal(setup.runtime.run(batch), on), f"step {step}: the replay differs"
        assert_same(caches(setup), off_kv, f"step {step} replay")
        token = int(on[0].argmax())


@pytest.mark.parametrize("device", triton_devices())
def test_layers_without_a_slot_keep_the_two_launches(device, kernels_on, monkeypatch) -> None:  # noqa: F811
    """q/k norms, an FP8 cache, chunked-local layers: no epilogue (the graph counts it per layer)."""
    monkeypatch.setenv(qr.ENV, kernels_on)
    for case, fused in SOME_FUSE.items():
        setup = build(device, case, record_kernels=True)
        assert counts(setup)["qkv_rope_gemm"] == fused, case


def _backends() -> list[str]:
    return backends(torch.device("cuda")) if torch.cuda.is_available() else []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("case", ["tiny-llama", "qwen2-bias-tied", "llama-3.2-1b-2-layers"])
def test_graphed_steps_equal_with_the_switch_off(monkeypatch, backend: str, case: str) -> None:
    """Two runtimes (switch 0 and 1) of the same weights, buckets 1 and 4, the same graphed steps:
    logits and every layer's K and V bit-equal after each (bs 1: fused; bs 3 in bucket 4: not)."""
    device = torch.device("cuda")
    calls = []
    fused = qr.norm_qkv_rope
    monkeypatch.setattr(qr, "norm_qkv_rope", lambda *a, **k: calls.append(1) or fused(*a, **k))
    setups = {}
    for on in ("0", "1"):
        monkeypatch.setenv(qr.ENV, on)
        setups[on] = build(device, case, backend=backend, buckets=(1, 4))
        assert bool(calls) == (on == "1"), "the bucket-1 graph captures the epilogue with the switch on only"
    tokens = [7]
    for step, rows in enumerate((1, 1, 3, 1)):
        logits = {}
        for on, setup in setups.items():
            monkeypatch.setenv(qr.ENV, on)
            logits[on] = setup.runtime.run(step_batch(setup, (tokens * rows)[:rows], 34 + step))
        assert torch.equal(logits["1"], logits["0"]), f"step {step}: the logits differ"
        assert_same(caches(setups["1"]), caches(setups["0"]), f"step {step}")
        tokens = [int(logits["0"][0].argmax())]

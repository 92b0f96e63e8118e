"""The fused expert kernels (``graphrt.kernels.moe``) against ``experts_reference``.

Both paths (skinny: ``T * k`` slots streaming their own experts; grouped: the aligned GEMMs),
both activations, with and without biases, pad rows (id ``E``, NaN weights, NaN activations)
that must add nothing. fp32 weights, so kernel and reference differ only by summation order.
Runs on the GPU (``-m gpu``) and on the CPU under ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from graphrt.kernels import tuning
from graphrt.kernels.moe import align, experts_reference, fused_experts, new_routing
from graphrt.kernels.moe import triton_experts as te
from tests.support.moe_util import random_experts, random_routing
from tests.support.triton_util import INTERPRET, rerun_marks, rerun_under_interpreter, triton_devices
from tests.support.tuning_util import patch_tuning

E, K, H, INTER = 8, 2, 64, 32
#: fp32 sums of H or I products in another order.
TOL = {"rtol": 1e-5, "atol": 1e-5}
#: Fewer, larger programs under the interpreter (its cost is per program).
SMALL_TILES = te.Tiles(block_n=32, block_k=32, skinny_n=64, skinny_k=64)
PATHS = {"skinny": 1000, "grouped": 0}


def _run(path: str, x: torch.Tensor, w, routing) -> torch.Tensor:
    """The Triton kernels with the path forced (the skinny ones up to ``PATHS[path]`` slots)."""
    return te.fused_experts_triton(x, w, routing, skinny_slots=PATHS[path])


#: ``(path, T, pad rows)``: the skinny path at decode sizes, the grouped one from 3 rows.
BATCHES = [("skinny", 1, ()), ("skinny", 3, (1,)), ("grouped", 3, (1,)), ("grouped", 16, (0, 9, 15))]
KINDS = [("silu", False), ("swiglu_clamp", True), ("silu", True)]


@pytest.fixture(autouse=True)
def _interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    if INTERPRET:
        monkeypatch.setenv(te.ENV, "interpret")
        monkeypatch.setenv(align.ENV, "interpret")
        patch_tuning(monkeypatch, moe=SMALL_TILES)


def _layer(device, tokens: int, pads, activation: str, bias: bool, seed: int = 0):
    w = random_experts(
        E, H, INTER, bias=bias, activation=activation, dtype=torch.float32, device=device, seed=seed
    )
    routing = random_routing(tokens, K, E, device, pad_rows=pads, seed=seed + tokens)
    x = torch.randn(tokens, H, generator=torch.Generator().manual_seed(seed)).to(device)
    x[list(pads)] = float("nan")  # NOTE: a pad row's input is garbage; it must reach nothing
    return x, w, routing


@pytest.mark.parametrize("device", triton_devices())
@pytest.mark.parametrize(("path", "tokens", "pads"), BATCHES)
@pytest.mark.parametrize(("activation", "bias"), KINDS)
def test_matches_reference(device, monkeypatch, path, tokens, pads, activation, bias) -> None:
    x, w, routing = _layer(device, tokens, pads, activation, bias)
    got = _run(path, x, w, routing)
    want = experts_reference(x, w, routing.topk_ids, routing.topk_weights)
    real = [t for t in range(tokens) if t not in pads]
    torch.testing.assert_close(got[real], want[real], **TOL)
    assert torch.equal(got[list(pads)], torch.zeros(len(pads), H, device=device)), "pad rows add nothing"
    if path == "grouped":  # NOTE: the alignment ran into routing: counts exclude the pad rows
        counts = torch.bincount(routing.topk_ids.reshape(-1).long().cpu(), minlength=E + 1)[:E]
        assert torch.equal(routing.expert_counts.cpu(), counts.int())


@pytest.mark.parametrize("device", triton_devices())
@pytest.mark.parametrize("split", [2, 4])
def test_split_skinny_down_matches_reference_and_repeats(device, monkeypatch, split) -> None:
    """The down kernel's slots walked in parts (fp32 partials summed by a second kernel): the
    reference's values, pad rows still zero, bit-equal calls (``split`` 4 > k runs as k parts)."""
    base = SMALL_TILES if INTERPRET else tuning.active().moe
    patch_tuning(monkeypatch, moe=replace(base, skinny_down_split=split))
    x, w, routing = _layer(device, 3, (1,), "swiglu_clamp", True, seed=3)
    got = _run("skinny", x, w, routing)
    want = experts_reference(x, w, routing.topk_ids, routing.topk_weights)
    torch.testing.assert_close(got[[0, 2]], want[[0, 2]], **TOL)
    assert torch.equal(got[1], torch.zeros(H, device=device)) and torch.equal(
        got, _run("skinny", x, w, routing)
    )


@pytest.mark.parametrize("device", triton_devices())
@pytest.mark.parametrize("path", list(PATHS))
def test_pad_rows_do_not_change_real_rows_and_calls_repeat(device, monkeypatch, path) -> None:
    """A batch with pad rows gives its real rows what they get alone; two calls agree bit for bit."""
    x, w, routing = _layer(device, 6, (3, 4), "swiglu_clamp", True, seed=5)
    got = _run(path, x, w, routing)
    assert torch.equal(got, _run(path, x, w, routing))
    keep = [t for t in range(6) if t not in (3, 4)]
    alone = new_routing(routing.topk_ids[keep].contiguous(), routing.topk_weights[keep].contiguous(), E)
    torch.testing.assert_close(got[keep], _run(path, x[keep], w, alone), **TOL)


def test_cpu_default_is_the_reference(monkeypatch) -> None:
    monkeypatch.delenv(te.ENV, raising=False)
    x, w, routing = _layer(torch.device("cpu"), 3, (1,), "silu", True)
    assert not te.enabled(x.device)
    want = experts_reference(x, w, routing.topk_ids, routing.topk_weights)
    assert torch.equal(fused_experts(x, w, routing), want)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda x, w, r: (x[:, :60], w, r), r"x \(3, 60\) and w13 \(8, 64, 64\)"),
        (lambda x, w, r: (x, w.__class__(w.w13, w.w2[:, :, :16], w.b13, w.b2), r), r"w2 is \(8, 64, 16\)"),
        (lambda x, w, r: (x.double(), w, r), "dtypes of x and the expert weights"),
        (lambda x, w, r: (x, w.__class__(w.w13, w.w2, activation="gelu"), r), "activation 'gelu'"),
        (lambda x, w, r: (x, w, new_routing(r.topk_ids.long(), r.topk_weights, E)), "topk_ids must be"),
    ],
)
def test_refuses_what_it_cannot_compute(change, match) -> None:
    x, w, routing = change(*_layer(torch.device("cpu"), 3, (), "silu", False))
    with pytest.raises(ValueError, match=match):
        te.check_experts(x, w, routing)


@rerun_marks
def test_kernels_under_triton_interpreter() -> None:
    """On a CPU box: this file again, with the kernels run by Triton's interpreter."""
    rerun_under_interpreter(__file__, passed=20)

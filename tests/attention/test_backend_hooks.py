"""A backend is one file plus one registry row: the toy backend (``tests/support/toy_backend.py``) with
its own host-written buffer and an in-graph plan, run graphed and eager on the CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrt.attention import registry
from graphrt.step import ForwardMode, SpecGeometry
from tests.support.toy_backend import ToyBackend
from tests.support.util import build_runtime, decode_batch, next_lens, prefill

ROWS = [0, 1, 2]


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "BACKENDS", {k: dict(v) for k, v in registry.BACKENDS.items()})
    registry.add_backend("mha", "toy", "tests.support.toy_backend:ToyBackend")  # NOTE: the one line


def test_toy_backend_plans_once_per_step_in_the_graph_and_eagerly(toy: None) -> None:
    device = torch.device("cpu")
    setup = build_runtime(device, backend="toy", max_batch_size=4)
    rt, rng = setup.runtime, np.random.default_rng(0)
    assert rt.backend.name == "toy" and rt.groups.group("attention") is not None
    prefill(setup, ROWS, [5, 9, 3], rng)
    group = rt.groups.groups["attention"].view(4)
    for step in range(3):
        batch = decode_batch(setup, ROWS, next_lens(setup, ROWS), rng)
        before, python_before = int(group.plans), ToyBackend.host_plans
        graphed = rt.run(batch)
        # NOTE: one plan per step (tiny-llama has several layers), run by the replay alone.
        assert int(group.plans) - before == 1
        assert ToyBackend.host_plans == python_before
        assert group.seen[:3].tolist() == batch.seq_lens.tolist(), step
        assert group.seen[3:].tolist() == [0]  # the pad row's host value
        eager = rt.run(batch, eager=True)
        assert ToyBackend.host_plans == python_before + 1
        torch.testing.assert_close(graphed, eager, rtol=1e-5, atol=1e-5)
    assert rt.stats().replays == {"DECODE": 3}


def test_toy_backend_is_refused_for_what_it_does_not_declare(toy: None) -> None:
    """Opt-in: the toy declares no token trees, so a tree runtime is refused naming both."""
    with pytest.raises(
        ValueError, match=r"'toy' does not declare token trees .*which the model \(TinyLlama\)"
    ):
        build_runtime(
            torch.device("cpu"),
            backend="toy",
            modes=(ForwardMode.TARGET_VERIFY,),
            speculative=SpecGeometry(num_steps=2, topk=2, num_draft_tokens=3),
        )
    with pytest.raises(ValueError, match=r"'toy' cannot be captured for IDLE \(it supports DECODE, "):
        build_runtime(torch.device("cpu"), backend="toy", modes=(ForwardMode.IDLE,))


def test_an_unnamed_backend_is_routed_to_one_that_serves_the_runtime(toy: None) -> None:
    """With the toy preferred, a decode runtime gets it; a tree runtime the reference."""
    registry.add_backend("mha", "toy", "tests.support.toy_backend:ToyBackend", first=True)
    tree = SpecGeometry(num_steps=2, topk=2, num_draft_tokens=3)
    plain = build_runtime(torch.device("cpu"), backend=None, capture=False)
    routed = build_runtime(torch.device("cpu"), backend=None, capture=False, speculative=tree)
    assert (plain.runtime.backend.name, routed.runtime.backend.name) == ("toy", "reference")


def test_backends_load_lazily_from_module_class_rows() -> None:
    module, _, cls = str(registry.BACKENDS["mha"]["reference"]).partition(":")
    assert registry.backend_class("mha", "reference").__name__ == cls and module.startswith("graphrt.")
    with pytest.raises(ValueError, match=r"backend target must be 'module:Class'"):
        registry.add_backend("mha", "broken", "no_colon")
    with pytest.raises(ValueError, match=r"a dispatch row lists rows of 'mha'; unknown: \['nope'\]"):
        registry.add_backend("mha", "broken", ("nope", "reference"))
    known = ", ".join(registry.BACKENDS["mha"])
    with pytest.raises(ValueError, match=rf"unknown attention backend 'nope'; known: {known}"):
        registry.select_backend("nope", torch.device("cpu"))


def test_fa3_plans_unsplit_steps_once_the_tiles_fill_the_gpu() -> None:
    """H100 (132 SMs), 8 KV heads: a bucket of 16 fills 128 of them (>= 80 %): one split, no
    combine kernel; a bucket of 1 leaves FA3's heuristic to split the keys."""
    from graphrt.attention.fa3_plan import planned_splits

    assert [planned_splits(bs, 8, 132) for bs in (1, 8, 13, 14, 16, 64)] == [0, 0, 0, 1, 1, 1]
    assert planned_splits(1, 32, 132) == 0 and planned_splits(4, 32, 132) == 1

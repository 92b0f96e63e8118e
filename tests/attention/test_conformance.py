"""Conformance: every registered attention backend against the reference backend's outputs.

Parametrized from the registry and each backend's declared :class:`~graphrt.attention.GraphSupport`
(``tests/support/conformance.py``), so a new row is picked up with no edit here: per feature
(decode, chain and tree verify, draft decode and extend, sliding window, chunked-local, sinks,
FP8 KV, dense and sparse MLA) a backend that declares what it needs gives the reference's logits
on the same weights, prefill and batch, graphed; one that does not is refused at build time. On
the CPU where the backend runs there (the recipe's toy backend; split decode under Triton's
interpreter), GPU-marked otherwise.
"""

from __future__ import annotations

import pytest
import torch

from graphrt.attention import registry
from tests.support import conformance
from tests.support.conformance import cases, conforms, cpu_dtype

#: Rows this file adds to the MHA table: the recipe's toy backend (``docs/recipes.md``).
TOY_ROWS = {"toy": "tests.support.toy_backend:ToyBackend"}


@pytest.fixture(autouse=True)
def rows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "BACKENDS", {k: dict(v) for k, v in registry.BACKENDS.items()})
    for name, target in TOY_ROWS.items():
        registry.add_backend("mha", name, target)
    conformance.add_presets(monkeypatch)


@pytest.mark.parametrize(("kind", "name", "feature", "where"), cases(TOY_ROWS))
def test_backend_conforms_to_the_reference(kind: str, name: str, feature: str, where: str) -> None:
    if where == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA")
    device = torch.device(where)
    if not registry.backend_class(kind, name).available(device, **conformance.CPU_NEED[kind]):
        pytest.skip(f"{name} is not available on {where}")
    conforms(kind, name, feature, device, cpu_dtype(kind, name) if where == "cpu" else None)


def test_a_toy_that_attends_a_tree_causally_fails_the_suite() -> None:
    """The toy with ``trees=True`` declared, attending a token tree as a causal chain (it ignores
    the cascade input): replay equals eager, yet its logits are not the reference's."""
    registry.add_backend("mha", "toy-causal-tree", "tests.support.toy_backend:CausalTreeToy")
    with pytest.raises(
        AssertionError, match=r"toy-causal-tree tree_verify: logits differ from the reference"
    ):
        conforms("mha", "toy-causal-tree", "tree_verify", torch.device("cpu"), torch.float32)


def test_a_toy_without_trees_is_refused_for_a_tree_runtime() -> None:
    conforms("mha", "toy", "tree_verify", torch.device("cpu"), torch.float32)  # NOTE: asserts the refusal
    with pytest.raises(ValueError, match=r"'toy' does not declare token trees"):
        conformance.setup(torch.device("cpu"), conformance.FEATURES["tree_verify"], "toy", torch.float32)


def test_the_cases_follow_the_registry() -> None:
    """Every row but the reference, for every feature of its kind; a new row adds its own."""
    ids = {p.id for p in cases(TOY_ROWS)}
    for kind, rows in registry.BACKENDS.items():
        for name in (n for n in rows if n != "reference"):
            assert all(f"{name}-{f}" in ids for f, feat in conformance.FEATURES.items() if feat.kind == kind)
    registry.add_backend("mha", "another", "tests.support.toy_backend:ToyBackend")
    assert {p.id for p in cases(TOY_ROWS)} > ids

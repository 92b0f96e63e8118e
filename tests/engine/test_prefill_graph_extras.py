"""Prefill graphs with the sampling extras an LLM's engine keeps: with penalties, log-probabilities
and token masks on, a prefill that replays a MIXED graph gives each request the first token, its
log-probabilities and its grammar's state that an eager EXTEND prefill gives (overlapped and
not; float32 on the CPU and, where there is one, CUDA; log-probabilities within 1e-5: the steps'
matmuls differ in shape).
"""

from __future__ import annotations

import json

import pytest

from graphrt import Engine
from tests.conftest import DEVICES
from tests.engine.test_mixed_engine import KW
from tests.engine.test_mixed_extras import (
    EXTRAS,
    PENALISED,
    SAMPLED,
    SCHEMA,
    _run,
    check_constrained,
    check_logprobs,
)


@pytest.fixture(scope="module", params=[True, False], ids=["overlap", "plain"])
def overlap(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


@pytest.fixture(scope="module", params=DEVICES)
def engines(request: pytest.FixtureRequest, overlap: bool) -> tuple[Engine, Engine]:
    """(prefills on graphs, eager prefills), both with every extra; on CUDA too (CUDA graphs,
    the overlapped copy and event after a replay)."""
    kw = KW | EXTRAS | {"overlap": overlap, "device": request.param}
    return Engine("tiny-llama", **kw), Engine("tiny-llama", **kw, prefill_graph_tokens=0)


def _all_replayed(graphed: Engine, eager: Engine) -> None:
    """Every prefill of ``graphed`` replayed a MIXED graph; ``eager``'s ran EXTEND."""
    stats = graphed.stats()
    assert stats.replays["MIXED"] == stats.prefill_steps > 0
    assert stats.eager == {} and stats.fallbacks == {}
    assert eager.stats().eager == {"EXTEND": eager.stats().prefill_steps}


@pytest.mark.parametrize("case", range(len(PENALISED)))
def test_penalised_tokens_equal_eager_prefills(engines: tuple[Engine, Engine], case: int) -> None:
    graphed, eager = engines
    params = PENALISED[case]
    plain = [None if p.greedy else SAMPLED for p in params]
    want = [r.output for r in _run(eager, params)]
    free = [r.output for r in _run(eager, plain)]
    for p, w, f in zip(params, want, free, strict=True):
        assert (w != f) == p.penalised, (p, w, f)  # NOTE: else the case checks nothing
    assert [r.output for r in _run(graphed, params)] == want
    _all_replayed(graphed, eager)


def test_logprobs_equal_eager_prefills(engines: tuple[Engine, Engine]) -> None:
    graphed, eager = engines
    check_logprobs(graphed, eager)
    _all_replayed(graphed, eager)


@pytest.mark.parametrize(
    ("kind", "source"), [("json_schema", json.dumps(SCHEMA)), ("regex", r"[a-c]{3}-[0-9]+")]
)
def test_constrained_tokens_equal_eager_prefills(
    engines: tuple[Engine, Engine], kind: str, source: str
) -> None:
    """A grammar (xgrammar) and a token-set rule: the first token is drawn in the prefill's
    graph under its mask, batched with an unconstrained, penalised row."""
    graphed, eager = engines
    check_constrained(graphed, eager, kind, source)
    _all_replayed(graphed, eager)

"""Mixed steps with the sampling extras an LLM's engine keeps: penalties, log-probabilities and
token masks on, chunked prefill replays MIXED graphs and gives what whole-prompt prefills give.

Both engines keep all three extras (as ``graphrt.LLM`` builds them) in float32, on the CPU and
(where there is one) CUDA; the reference prefills whole prompts (eager EXTEND, overlapped).
Tokens are equal, log-probabilities within 1e-5 (the steps' matmuls differ in shape). A request's counts and mask start right before the
step of its prompt's last chunk, so what its earlier chunks drew (and dropped) counts nowhere:
a presence bonus on seen tokens would pick one of those draws otherwise.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import torch

from graphrt import Engine, SamplingParams
from graphrt.engine.config import token_ladder
from graphrt.text.grammar import Constraint
from tests.conftest import DEVICES
from tests.engine.test_constraints import Stepwise
from tests.engine.test_logprobs import K
from tests.engine.test_mixed_engine import BUDGETS, KW, PROMPTS

EXTRAS = {"penalties": True, "max_logprobs": K, "token_masks": True, "dtype": torch.float32}
CHUNK = 12
SAMPLED = SamplingParams(temperature=0.8, seed=7)
#: One request per prompt; each penalty changes its request's tokens (checked).
PENALISED = [
    [
        SamplingParams(presence_penalty=-2.0),
        SamplingParams(frequency_penalty=-1.5),
        SamplingParams(repetition_penalty=0.1),
        SamplingParams(temperature=0.8, seed=7, repetition_penalty=0.1, frequency_penalty=-2.0),
    ],
    [
        SamplingParams(temperature=0.8, seed=7, repetition_penalty=0.2),
        SamplingParams(presence_penalty=-2.0, frequency_penalty=-1.0),
        SamplingParams(),
        SamplingParams(repetition_penalty=0.3, frequency_penalty=-1.0),
    ],
]


@pytest.fixture(scope="module", params=DEVICES)
def engines(request: pytest.FixtureRequest) -> tuple[Engine, Engine]:
    """(chunked on graphs, whole-prompt reference), both with every extra."""
    kw = KW | EXTRAS | {"device": request.param}
    chunked = Engine("tiny-llama", **kw, prefill_chunk=CHUNK)
    assert chunked.runtime.config.token_buckets == token_ladder(CHUNK)
    return chunked, Engine("tiny-llama", **kw, prefill_graph_tokens=0)  # NOTE: eager prefills


def _run(
    engine: Engine, params: list[SamplingParams | None], constraints: list[Any] | None = None
) -> list[Any]:
    """Each prompt of ``PROMPTS`` with its budget, ``params`` and constraint; the requests."""
    rules = constraints or [None] * len(PROMPTS)
    rids = [
        engine.add_request(p, n, s, constraint=c)
        for p, n, s, c in zip(PROMPTS, BUDGETS, params, rules, strict=True)
    ]
    reqs = [engine.scheduler.find(r) for r in rids]
    while engine.waiting or engine.running:
        engine.step()
    return reqs


def _all_replayed(engine: Engine) -> None:
    """Every chunked step so far, mixed or prefill-only, replayed a MIXED graph."""
    stats = engine.stats()
    assert stats.mixed_steps > 0 and stats.fallbacks == {} and stats.eager == {}
    assert stats.replays["MIXED"] == stats.mixed_steps + stats.prefill_steps


@pytest.mark.slow
@pytest.mark.parametrize("case", range(len(PENALISED)))
def test_penalised_tokens_equal_whole_prompt_prefills(engines: tuple[Engine, Engine], case: int) -> None:
    chunked, whole = engines
    params = PENALISED[case]
    plain = [None if p.greedy else SAMPLED for p in params]
    want = [r.output for r in _run(whole, params)]
    free = [r.output for r in _run(whole, plain)]
    for p, w, f in zip(params, want, free, strict=True):
        assert (w != f) == p.penalised, (p, w, f)  # NOTE: else the case checks nothing
    assert [r.output for r in _run(chunked, params)] == want
    _all_replayed(chunked)


@pytest.mark.slow
def test_logprobs_equal_whole_prompt_prefills(engines: tuple[Engine, Engine]) -> None:
    chunked, whole = engines
    check_logprobs(chunked, whole)
    _all_replayed(chunked)


def check_logprobs(got_engine: Engine, want_engine: Engine) -> None:
    """Greedy, sampled and penalised rows asking for log-probabilities: ``got_engine`` gives
    ``want_engine``'s tokens, and each token's log-probability and top ones within 1e-5."""
    params = [
        SamplingParams(logprobs=K),
        SamplingParams(temperature=0.9, top_p=0.9, seed=3, logprobs=2),
        SamplingParams(logprobs=0, frequency_penalty=-1.0),
        SamplingParams(logprobs=K, repetition_penalty=0.3),
    ]
    got, want = _run(got_engine, params), _run(want_engine, params)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.output == w.output and len(g.logprobs) == len(g.output) == BUDGETS[i], i
        for step, (a, b) in enumerate(zip(g.logprobs, w.logprobs, strict=True)):
            where = (i, step)
            assert a.token == b.token and a.logprob == pytest.approx(b.logprob, abs=1e-5), where
            assert list(a.top_ids) == list(b.top_ids) and len(a.top_ids) == params[i].logprobs, where
            assert np.allclose(a.top_logprobs, b.top_logprobs, atol=1e-5), where


def toy_grammar(vocab: int, kind: str, source: str) -> Any:
    """xgrammar's compiled ``kind`` (``"json_schema"`` or ``"regex"``) over a made-up vocabulary
    of ``vocab`` tokens: 0 the stop token, then the printable ASCII characters, then pieces."""
    import xgrammar as xgr

    chars = [chr(c) for c in range(32, 127)]
    pieces = ['{"', '":', ', "', '"}', "true", "false", "null", "12", "ab"]
    encoded = ["</s>", *chars, *pieces]
    encoded += [f"w{i}" for i in range(vocab - len(encoded))]
    info = xgr.TokenizerInfo(encoded, xgr.VocabType.RAW, vocab_size=vocab, stop_token_ids=[0])
    compiler = xgr.GrammarCompiler(info, max_threads=1)
    if kind == "regex":
        return compiler.compile_regex(source)
    return compiler.compile_json_schema(source, any_whitespace=False)


SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}},
    "required": ["n", "ok"],
}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "source"), [("json_schema", json.dumps(SCHEMA)), ("regex", r"[a-c]{3}-[0-9]+")]
)
def test_constrained_tokens_equal_whole_prompt_prefills(
    engines: tuple[Engine, Engine], kind: str, source: str
) -> None:
    """A grammar (xgrammar) and a token-set rule: the first token comes from a prompt's last
    chunk under its mask, batched with unconstrained and penalised rows."""
    chunked, whole = engines
    check_constrained(chunked, whole, kind, source)
    _all_replayed(chunked)


def check_constrained(got_engine: Engine, want_engine: Engine, kind: str, source: str) -> None:
    """Two constrained rows (``kind`` over ``source``), a token-set rule and an unconstrained
    penalised row: ``got_engine`` gives ``want_engine``'s tokens, every constrained row follows
    its rule (its tokens differ from the free run's) and the unconstrained one is untouched."""
    vocab = got_engine.model.vocab_size
    compiled = toy_grammar(vocab, kind, source)
    params = [SAMPLED, None, SamplingParams(presence_penalty=-1.0), SAMPLED]

    def rules() -> list[Any]:
        return [
            Constraint(compiled, vocab),
            Stepwise(vocab, [set(range(100, 140))]),
            None,
            Constraint(compiled, vocab),
        ]

    want = _run(want_engine, params, rules())
    free = [r.output for r in _run(want_engine, params)]
    got = _run(got_engine, params, rules())
    assert [r.output for r in got] == [r.output for r in want]
    for i in (0, 1, 3):
        assert got[i].output != free[i] and got[i].constraint.accepted == len(got[i].output), i
    assert got[2].output == free[2]  # NOTE: an unconstrained row is untouched

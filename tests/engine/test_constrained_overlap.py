"""An overlapped engine's constrained decoding: the step in flight is read between the next
step's metadata write and its launch (graphed: between the step's forward graph and its sampler
graph, runtime/split_pairs.py), and its masks written there. Greedy, its tokens are
exactly the non-overlapped engine's, with a grammar (xgrammar) and a token-set rule batched with
an unconstrained row, a constrained request ending on a stop token while the others run (its
extra launched step dropped), budgets ending at different steps and a request joining mid-way.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from graphrt import Engine, SamplingParams
from graphrt.text.grammar import Constraint
from tests.conftest import DEVICES
from tests.engine.test_constraints import KW, Stepwise
from tests.engine.test_mixed_extras import SCHEMA, toy_grammar

PROMPTS = [np.random.default_rng(40 + i).integers(0, 512, n).tolist() for i, n in enumerate((5, 8, 3, 6))]
BUDGETS = [9, 7, 8, 5]
#: The token-set rule's last set is the stop token alone: that request ends on it.
STOP = 5
JOINS = 3  # NOTE: the last prompt is added after this many steps


def rules(vocab: int, compiled: Any) -> list[Any]:
    """Per prompt: a grammar, a rule ending on :data:`STOP`, nothing, a rule."""
    ending = Stepwise(vocab, [set(range(100, 140)), {7, 300, 9}, set(range(200, 260)), {STOP}])
    return [Constraint(compiled, vocab), ending, None, Stepwise(vocab, [set(range(60, 90))])]


def decode(engine: Engine, constraints: list[Any]) -> list[Any]:
    """Every prompt (the last one joining after :data:`JOINS` steps), greedy; the requests."""
    params = [None, SamplingParams(stop_token_ids=(STOP,)), None, None]
    rids = [
        engine.add_request(p, n, s, constraint=c)
        for p, n, s, c in list(zip(PROMPTS, BUDGETS, params, constraints, strict=True))[:-1]
    ]
    for _ in range(JOINS):
        engine.step()
    rids.append(engine.add_request(PROMPTS[-1], BUDGETS[-1], params[-1], constraint=constraints[-1]))
    reqs = [engine.scheduler.find(r) for r in rids]
    while engine.waiting or engine.running:
        engine.step()
    assert not engine.running and (engine.overlap is None or engine.overlap.inflight is None)
    return reqs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["json_schema", "regex"])
def test_overlapped_constrained_tokens_equal_the_non_overlapped_ones(device: str, kind: str) -> None:
    kw = KW | {"device": device, "token_masks": True}
    plain = Engine(overlap=False, **kw)
    vocab = plain.model.vocab_size
    source = json.dumps(SCHEMA) if kind == "json_schema" else r"[a-c]{3}-[0-9]+"
    compiled = toy_grammar(vocab, kind, source)
    want = decode(plain, rules(vocab, compiled))
    free = [plain.generate([p], n)[0] for p, n in zip(PROMPTS, BUDGETS, strict=True)]
    ending = want[1].output
    assert ending[-1] == STOP and len(ending) == 4 < BUDGETS[1]  # NOTE: ended on its stop token
    assert want[2].output == free[2]  # NOTE: the unconstrained row is untouched
    for graphs in (True, False):
        overlapped = Engine(overlap=True, use_graphs=graphs, **kw)
        assert overlapped.overlap is not None
        got = decode(overlapped, rules(vocab, compiled))
        assert [r.output for r in got] == [r.output for r in want], graphs
        # NOTE: graphed, each constrained step wrote its masks between its forward and sampler graphs
        split = overlapped.runtime.stats().split.get("DECODE", 0)
        assert split > 0 if graphs else split == 0, (graphs, split)
        for i in (0, 1, 3):
            assert got[i].constraint.accepted == len(got[i].output), (graphs, i)
            assert got[i].output != free[i][: len(got[i].output)], (graphs, i)
        assert overlapped.generate(PROMPTS, 4) == [f[:4] for f in free]  # NOTE: rows all-allowed again

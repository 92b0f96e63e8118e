"""The host replay of proposer rounds (tools/bench/spec_replay.py) counts what the engine counts:
the same rounds, drafts, acceptances and stale rounds for one request, synchronous and overlapped."""

from __future__ import annotations

import numpy as np
import pytest

from graphrt import Engine
from graphrt.engine.spec_options import SpecOptions
from graphrt.tools.bench.spec_replay import oracle, replay

_BASE = np.random.default_rng(0).integers(0, 512, 5).tolist()
PROMPT = _BASE * 3 + _BASE[:2]
MAX_NEW = 24
SPEC = {"method": "ngram", "num_steps": 3, "min_match": 2, "max_match": 4}
KW = {"device": "cpu", "max_batch_size": 1, "max_context_len": 64, "use_graphs": False}


@pytest.fixture(scope="module")
def greedy() -> list[int]:
    return Engine("tiny-llama", **KW).generate([PROMPT], MAX_NEW)[0]  # type: ignore[arg-type]


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
@pytest.mark.parametrize("gate", [0.0, 0.6], ids=["ungated", "gated"])
def test_replay_counts_the_engine_rounds(greedy: list[int], overlap: bool, gate: float) -> None:
    spec = SPEC | {"min_hit_rate": gate}
    e = Engine("tiny-llama", overlap=None if overlap else False, speculative=spec, **KW)  # type: ignore[arg-type]
    assert e.generate([PROMPT], MAX_NEW)[0] == greedy
    stats = e.stats()
    got = replay(PROMPT, greedy, SpecOptions.parse(spec), overlap).summary()
    assert stats.spec_overlap == overlap and got["tokens"] == MAX_NEW - 1
    assert (stats.drafts_proposed, stats.drafts_accepted) == (got["offered"], got["accepted"])
    assert stats.tokens_per_round == got["tokens_per_round"]
    assert stats.backoff["stale_rows"] == got["stale"]
    assert got["drafted"] > 0


def test_oracle_of_a_loop_predicts_everything() -> None:
    options = SpecOptions.parse(SPEC)
    loop = [1, 2, 3, 4] * 6
    best = oracle([1, 2, 3, 4] * 2, loop, options)
    # every token after the prefill's is guessed: 3 drafts and the bonus a round, the last round
    # cut by the budget (2 drafts): 23 tokens in 6 rounds
    assert best["predicted"] == 1.0 and best["tokens_per_round"] == 23 / 6
    nothing = oracle([5, 6, 7], [8, 9, 10, 11], options)
    assert nothing == {"predicted": 0.0, "tokens_per_round": 1.0}

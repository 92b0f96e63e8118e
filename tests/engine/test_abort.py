"""``Engine.abort``: a waiting or running request leaves at once, its row and pages are free, and
the other requests' tokens are those they get alone — with a step in flight (overlap) or not.
"""

from __future__ import annotations

import numpy as np
import pytest

from graphrt import Engine

KW = {"device": "cpu", "max_batch_size": 4, "max_context_len": 64, "buckets": (1, 2, 4)}
PROMPTS = [np.random.default_rng(i).integers(0, 512, n).tolist() for i, n in enumerate((5, 9, 3, 7, 4))]
MAX_NEW = 10


@pytest.fixture(scope="module", params=[True, False], ids=["overlap", "plain"])
def engine(request: pytest.FixtureRequest) -> Engine:
    return Engine(overlap=request.param, **KW)  # type: ignore[arg-type]


def all_free(e: Engine) -> None:
    """Nothing runs or waits, every row and page is back, the KV ledger holds nothing."""
    assert not e.running and not e.waiting
    assert sorted(e.pool.rows) == list(range(KW["max_batch_size"]))
    assert sorted(e.pool.unheld()) == list(range(e.kv.dummy_page))
    ledger = e.runtime.req_to_token.ledger
    assert not ledger.valid_lens.any() and not ledger.refs.any()


def test_abort_running_and_waiting(engine: Engine) -> None:
    alone = [engine.generate([p], MAX_NEW)[0] for p in PROMPTS]
    rids = [engine.add_request(p, MAX_NEW) for p in PROMPTS]  # 4 run, the fifth waits
    seen: dict[int, list[int]] = {rid: [] for rid in rids}
    for _ in range(4):
        for rid, t in engine.step():
            seen[rid].append(t)
    running = engine.abort(rids[1])
    assert running is not None and running.done and running.req_idx == -1 and not running.pages
    waiting = engine.abort(rids[4]) if engine.waiting else None
    assert waiting is None or waiting.output == []
    assert engine.abort(rids[1]) is None and engine.abort(10**6) is None
    while engine.running or engine.waiting:
        for rid, t in engine.step():
            seen[rid].append(t)
    assert seen[rids[1]] == running.output and len(running.output) < MAX_NEW  # nothing after abort
    for i in (0, 2, 3):
        assert engine.finished[rids[i]].output == alone[i] == seen[rids[i]]
    assert engine.abort(rids[0]) is not None and rids[0] not in engine.finished
    all_free(engine)


def test_abort_every_request_mid_decode_then_serve_again(engine: Engine) -> None:
    rids = [engine.add_request(p, MAX_NEW) for p in PROMPTS[:4]]
    for _ in range(3):
        engine.step()
    for rid in rids:
        assert engine.abort(rid) is not None
    assert engine.step() == []  # the step in flight is read; its tokens belong to no one
    all_free(engine)
    assert engine.generate([PROMPTS[2]], MAX_NEW) == [engine.generate([PROMPTS[2]], MAX_NEW)[0]]
    all_free(engine)

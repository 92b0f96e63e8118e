"""An Engine shared by threads serves each call exactly what it would get alone; a failed call
leaves no request behind; finished requests are handed out, not kept; the door is typed.

Graphed (emulated graphs) and eager engines of a one-layer preset, on the CPU.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from graphrt import Engine, SamplingParams
from graphrt.kv.ledger import KVIsolationError

PROMPTS = [[1 + i, 2 + i, 3 + i, 4 * i + 5] for i in range(8)]


@pytest.fixture(scope="module", params=[True, False], ids=["graph", "eager"])
def engine(request: pytest.FixtureRequest) -> Engine:
    return Engine(
        "tiny-llama-draft", device="cpu", max_batch_size=4, max_context_len=64, use_graphs=request.param
    )


def assert_empty(engine: Engine) -> None:
    """No request left anywhere, every row and page back, the KV ledger empty."""
    assert not engine.waiting and not engine.running and not engine.finished
    assert len(engine.pool.rows) == 4
    table = engine.runtime.req_to_token
    assert not table.valid_lens.any() and not table.ledger.refs.any()


def _alone(engine: Engine) -> list[list[int]]:
    return [engine.generate([p], 4)[0] for p in PROMPTS]


@pytest.mark.parametrize("threads", [4, 8])
def test_threads_sharing_an_engine_get_their_own_tokens(engine: Engine, threads: int) -> None:
    alone = _alone(engine)
    for _ in range(20):
        got: dict[int, list[list[int]]] = {}

        def call(t: int, got: dict[int, list[list[int]]] = got) -> None:
            mine = PROMPTS[t % len(PROMPTS) :] + PROMPTS[: t % len(PROMPTS)]
            got[t] = engine.generate(mine[:2], 4)

        workers = [threading.Thread(target=call, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        for t, out in got.items():
            k = t % len(PROMPTS)
            assert out == [alone[k], alone[(k + 1) % len(PROMPTS)]], t
        assert_empty(engine)


def test_a_failed_call_leaves_no_request_behind(engine: Engine) -> None:
    with pytest.raises(ValueError, match=r"token id 99999 out of range"):
        engine.generate([[1, 2, 3], [99999]], 4)
    assert not engine.waiting and not engine.running and not engine.finished
    steps = 0

    def interrupt() -> list[tuple[int, int]]:
        nonlocal steps
        steps += 1
        if steps == 3:
            raise KeyboardInterrupt
        return Engine.step(engine)

    engine.step = interrupt  # type: ignore[method-assign]
    try:
        with pytest.raises(KeyboardInterrupt):
            engine.generate(PROMPTS[:3], 6)
    finally:
        del engine.step
    assert_empty(engine)
    assert engine.generate([PROMPTS[0]], 4) == _alone(engine)[:1]


def failing(engine: Engine, at: int, error: BaseException) -> Callable[[], None]:
    """Make the ``at``-th step the engine's runtime runs raise ``error``; returns the undo."""
    run, calls = engine.runtime.run, [0]

    def broken(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == at:
            raise error
        return run(*args, **kwargs)

    engine.runtime.run = broken  # type: ignore[method-assign]
    return lambda: setattr(engine.runtime, "run", run)


@pytest.mark.parametrize("at", [1, 3], ids=["prefill", "decode"])
@pytest.mark.parametrize(
    "error", [KVIsolationError("refused"), KeyboardInterrupt()], ids=["refused", "interrupt"]
)
def test_a_step_that_raises_leaves_no_request(engine: Engine, at: int, error: BaseException) -> None:
    """The call raises the step's error; nothing of it stays (queues, rows, pages, KV ledger,
    finished), and the engine serves the same tokens after."""
    sampling = SamplingParams(temperature=0.7, seed=3)
    alone = engine.generate(PROMPTS[:3], 4, sampling)
    undo = failing(engine, at, error)
    try:
        with pytest.raises(type(error)):
            engine.generate(PROMPTS[:3], 4, sampling)
    finally:
        undo()
    assert_empty(engine)
    assert engine.generate(PROMPTS[:3], 4, sampling) == alone


def test_a_genuinely_refused_step_leaves_no_request(engine: Engine) -> None:
    """A scheduler bug gives the second request the first one's pages: the prefill is refused
    before anything is written, and the call leaves nothing behind."""
    alone = engine.generate(PROMPTS[:2], 3)
    admit, free_pages = engine.pool.admit, list(engine.pool.pages)

    def shared_pages(*args: Any) -> list[Any]:
        admitted = admit(*args)
        if len(admitted) == 2:
            engine.pool.pages.extend(admitted[1].pages)
            admitted[1].pages = list(admitted[0].pages)
        return admitted

    engine.pool.admit = shared_pages  # type: ignore[method-assign]
    try:
        with pytest.raises(ValueError, match=r"out_cache_loc must be distinct"):
            engine.generate(PROMPTS[:2], 3)
    finally:
        engine.pool.admit = admit  # type: ignore[method-assign]
    assert_empty(engine)
    # NOTE: both requests gave their pages back; request 0's twice, the test's own doing
    assert sorted(set(engine.pool.pages)) == sorted(free_pages)
    engine.pool.pages = deque(free_pages)
    assert engine.generate(PROMPTS[:2], 3) == alone


def test_finished_requests_are_not_kept(engine: Engine) -> None:
    for _ in range(30):
        engine.generate(PROMPTS[:4], 2)
    assert engine.finished == {}


@pytest.mark.parametrize(
    ("prompts", "budget", "message"),
    [
        (["123"], 2, r"prompts\[0\] is a str; token ids are a sequence of integers"),
        ("hello", 2, r"prompts must be a sequence of token-id sequences, got str"),
        ([[1, 2.0]], 2, r"prompts\[0\]\[1\] is 2.0 \(float\): token ids must be integers"),
        ([[1, True]], 2, r"prompts\[0\]\[1\] is True \(bool\): token ids must be integers"),
        ([[1, 2]], 2.5, r"max_new_tokens must be an int or a sequence of ints, got 2.5"),
        ([[1, 2]], [True], r"max_new_tokens\[0\] is True \(bool\): budgets must be integers"),
    ],
)
def test_generate_refuses_what_it_used_to_coerce(engine: Engine, prompts, budget, message) -> None:
    with pytest.raises(TypeError, match=message):
        engine.generate(prompts, budget)
    assert not engine.waiting and not engine.running


def test_integer_arrays_are_token_ids(engine: Engine) -> None:
    ids = np.array(PROMPTS[1], dtype=np.int32)
    assert engine.generate([ids], 4, SamplingParams()) == [_alone(engine)[1]]

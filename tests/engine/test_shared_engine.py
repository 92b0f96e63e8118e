"""An Engine shared by threads serves each call exactly what it would get alone; a failed call
leaves no request behind; finished requests are handed out, not kept; the door is typed."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from graphrt import Engine, SamplingParams

PROMPTS = [[1 + i, 2 + i, 3 + i, 4 * i + 5] for i in range(8)]


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine("tiny-llama", device="cpu", max_batch_size=4, max_context_len=64)


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
        assert not engine.waiting and not engine.running and not engine.finished


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
    assert not engine.waiting and not engine.running and not engine.finished
    assert len(engine.pool.rows) == 4  # every row given back
    assert engine.generate([PROMPTS[0]], 4) == _alone(engine)[:1]


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

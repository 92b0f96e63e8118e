"""Issue 24.2 and 24.7: one Engine shared by threads; finished requests are not kept.

4 and 8 threads call ``generate`` at once, 20 times in a row: every call gets exactly the
tokens it gets alone (greedy and seeded sampling), and the engine ends empty: no request
waiting, running or finished, every request row and page free. ``generate`` hands its
finished requests back and forgets them (the engine held every one of them before).
"""

from __future__ import annotations

import threading

import pytest
import torch

from graphrt import Engine, SamplingParams

ROUNDS, NEW = 20, 2
_ENGINES: dict[str, Engine] = {}


def engine_on(device: torch.device) -> Engine:
    """One engine per device (graphs: emulated on the CPU), shared by the tests."""
    if device.type not in _ENGINES:
        _ENGINES[device.type] = Engine(device=device, max_batch_size=4, max_context_len=64)
    return _ENGINES[device.type]


def call(i: int) -> tuple[list[list[int]], SamplingParams | None]:
    """Thread ``i``'s prompts (one or two) and sampling: greedy, or seeded sampling."""
    prompts = [[1 + i, 2, 3 + i % 5]] + ([[7, 8 + i]] if i % 3 == 0 else [])
    sampling = SamplingParams(temperature=0.8, top_k=20, seed=100 + i) if i % 2 else None
    return prompts, sampling


def assert_empty(engine: Engine) -> None:
    assert not engine.waiting and not engine.running and not engine.finished
    table = engine.runtime.req_to_token
    assert not table.valid_lens.any() and not table.ledger.refs.any()
    assert sorted(engine.pool.rows) == list(range(table.max_reqs))


def together(engine: Engine, threads: int) -> dict[int, list[list[int]]]:
    """Each of ``threads`` threads calls ``generate`` once, all released at the same moment."""
    results: dict[int, list[list[int]]] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(threads)

    def caller(i: int) -> None:
        try:
            barrier.wait()
            prompts, sampling = call(i)
            results[i] = engine.generate(prompts, NEW, sampling)
        except BaseException as err:  # NOTE: reported by the caller of together()
            errors.append(err)

    workers = [threading.Thread(target=caller, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize("threads", [4, 8])
def test_threads_get_what_they_get_alone(device: torch.device, threads: int) -> None:
    engine = engine_on(device)
    alone = [engine.generate(call(i)[0], NEW, call(i)[1]) for i in range(threads)]
    assert_empty(engine)
    for round_ in range(ROUNDS):
        results = together(engine, threads)
        assert [results[i] for i in range(threads)] == alone, f"round {round_}"
        assert_empty(engine)


def test_generate_forgets_finished_requests(device: torch.device) -> None:
    """60 calls leave nothing behind; the token count of ``stats`` still covers them all."""
    engine = engine_on(device)
    before = engine.stats().generated_tokens
    for i in range(60):
        assert len(engine.generate([[1, 2, 3 + i % 7]], 1)[0]) == 1
        assert not engine.finished
    assert engine.stats().generated_tokens == before + 60
    assert_empty(engine)


def test_step_interface_keeps_finished_until_taken(device: torch.device) -> None:
    """``add_request`` / ``step`` callers read ``finished`` themselves: it is theirs to pop."""
    engine = engine_on(device)
    rid = engine.add_request([5, 6, 7], 2)
    while engine.waiting or engine.running:
        engine.step()
    assert len(engine.finished.pop(rid).output) == 2
    assert_empty(engine)

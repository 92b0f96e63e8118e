"""Issue 24.2 and 24.4 at the engine's door: strict inputs, and a failed call leaves nothing.

``generate`` refuses what it used to coerce (a string prompt, float or bool ids, a float
budget) with a ``TypeError`` naming the argument and the index, before queueing anything. A
call that fails later (a refused step, ``KeyboardInterrupt``) leaves none of its requests
behind, and the next call gets the tokens it would get on a fresh engine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from graphrt import Engine, SamplingParams
from graphrt.kv.ledger import KVIsolationError
from tests.test_engine_threads import assert_empty

PROMPTS = [[1, 2, 3], [4, 5, 6, 7], [8, 9]]
_ENGINES: dict[tuple[str, str], Engine] = {}
KINDS = {
    "overlap": {},
    "plain": {"overlap": False},
    "speculative": {"speculative": {"draft_model": "tiny-llama-draft", "num_steps": 2}},
}


def engine_of(device: torch.device, kind: str) -> Engine:
    key = (device.type, kind)
    if key not in _ENGINES:
        _ENGINES[key] = Engine(device=device, max_batch_size=2, max_context_len=64, **KINDS[kind])
    return _ENGINES[key]


BAD: dict[str, tuple[tuple[Any, ...], str]] = {
    "string prompts": (("123", 2), r"prompts must be a list of prompts .* got str"),
    "string prompt": ((["123"], 2), r"prompts\[0\] must be a list of int token ids .* got str"),
    "float id": (([[1, 2], [3, 4.0]], 2), r"prompts\[1\]\[1\] must be an int, got float 4\.0"),
    "bool id": (([[1, True]], 2), r"prompts\[0\]\[1\] must be an int, got bool True"),
    "float array": (([np.array([1.0, 2.0])], 2), r"1-D array of integers, got 1-D dtype float64"),
    "float budget": (([[1, 2]], 2.5), r"max_new_tokens must be an int or a list of ints, got float 2\.5"),
    "bool budget": (([[1, 2]], True), r"got bool True"),
    "float budgets": (([[1], [2]], [1, 2.0]), r"max_new_tokens\[1\] must be an int, got float"),
    "sampling": (([[1]], 2, "greedy"), r"sampling must be a SamplingParams, a list of them or None, got str"),
    "sampling item": (([[1]], 2, [1]), r"sampling\[0\] must be a SamplingParams or None, got int"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_generate_refuses_what_it_used_to_coerce(device: torch.device, case: str) -> None:
    engine = engine_of(device, "plain")
    args, message = BAD[case]
    with pytest.raises(TypeError, match=message):
        engine.generate(*args)
    assert_empty(engine)
    with pytest.raises(TypeError, match=r"prompt\[0\] must be an int, got str"):
        engine.add_request(["7"], 2)
    assert_empty(engine)


def test_a_bad_prompt_queues_none_of_the_call(device: torch.device) -> None:
    engine = engine_of(device, "plain")
    with pytest.raises(ValueError, match=r"token id 9999 out of range \[0, 512\) at prompts\[2\]\[0\]"):
        engine.generate([[1], [2], [9999]], 2)
    assert_empty(engine)
    assert engine.generate([np.array([1, 2]), (3, np.int64(4))], np.array([2, 1])) == [
        engine.generate([[1, 2]], 2)[0],
        engine.generate([[3, 4]], 1)[0],
    ]


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


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("at", [1, 3])
@pytest.mark.parametrize(
    "error", [KVIsolationError("refused"), KeyboardInterrupt()], ids=["refused", "interrupt"]
)
def test_failed_call_leaves_no_request(
    device: torch.device, kind: str, at: int, error: BaseException
) -> None:
    """A step that raises at the prefill (1) or mid-decode (3): the call raises it, nothing of
    it stays (queues, rows, pages, KV ledger, finished), and the engine still serves."""
    engine = engine_of(device, kind)
    sampling = None if kind == "speculative" else SamplingParams(temperature=0.7, seed=3)
    alone = engine.generate(PROMPTS, 4, sampling)
    undo = failing(engine, at, error)
    try:
        with pytest.raises(type(error)):
            engine.generate(PROMPTS, 4, sampling)
    finally:
        undo()
    assert_empty(engine)
    for table in [engine.runtime.req_to_token] + ([engine.spec.draft.req_to_token] if engine.spec else []):
        assert not table.valid_lens.any() and not table.ledger.refs.any()
    assert engine.generate(PROMPTS, 4, sampling) == alone


def test_refused_step_of_a_scheduler_bug(device: torch.device) -> None:
    """A genuine refusal: the second request is given the first one's pages. The prefill is
    refused before anything is written, and the call leaves nothing behind."""
    engine = engine_of(device, "plain")
    alone = engine.generate(PROMPTS[:2], 3)
    admit = engine.pool.admit

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
    assert engine.generate(PROMPTS[:2], 3) == alone

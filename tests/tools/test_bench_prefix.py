"""``graphrt bench prefix``'s measurement on the CPU (tiny-llama): the steps traced until every
request has its first token say what each step admitted and computed, with and without
prefix caching, and both engines give the same tokens."""

from __future__ import annotations

from graphrt import Engine
from graphrt.tools.bench.prefix import measure, workload

REQUESTS, SYSTEM, USER, NEW = 4, 40, 6, 3


def traced(caching: bool) -> dict:
    engine = Engine(
        "tiny-llama", device="cpu", max_batch_size=REQUESTS, max_context_len=64, prefix_caching=caching
    )
    prompts, warm = workload(engine.model.vocab_size, REQUESTS, SYSTEM, USER)
    assert len(warm) == REQUESTS and warm[0][:SYSTEM] != prompts[0][:SYSTEM]  # another system prompt
    return measure(engine, prompts, warm, NEW)


def test_the_trace_shows_what_each_step_admitted_and_computed() -> None:
    off, on = traced(False), traced(True)
    assert off["outputs"] == on["outputs"]
    whole = SYSTEM + USER
    keys = ("prefill", "admitted", "computed", "first_tokens")
    # overlapped: a step's tokens are read by the next step
    assert [tuple(s[k] for k in keys) for s in off["trace"]] == [
        (True, REQUESTS, REQUESTS * whole, 0),
        (False, 0, 0, REQUESTS),
    ]
    # the first request computes the whole prompt; the others join with what follows the
    # two cached pages of 16
    assert [tuple(s[k] for k in keys) for s in on["trace"]] == [
        (True, 1, whole, 0),
        (True, REQUESTS - 1, (REQUESTS - 1) * (whole - 32), 1),
        (False, 0, 0, REQUESTS - 1),
    ]
    assert off["steps_to_first_token"] == {"p50": 2.0, "max": 2}
    assert on["steps_to_first_token"] == {"p50": 3.0, "max": 3}
    assert on["prefilled_tokens"] == whole + (REQUESTS - 1) * (whole - 32)
    assert all(s["ms"] > 0 for s in off["trace"] + on["trace"])

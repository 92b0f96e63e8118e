"""Admission under prefix caching (fp32 CPU, tiny-llama): a burst of prompts over several
shared prefixes prefills one request per prefix, then every other request in the next step
with only its own tokens; a request waits for the pages a chunked prefill computes instead of
computing them again; a request's page keys are hashed once however long it waits. Tokens
equal those of an engine without caching throughout.
"""

from __future__ import annotations

import numpy as np
import pytest

from graphrt import Engine
from graphrt.engine.prefix_cache import chain_hash

KW = {"device": "cpu", "max_context_len": 96, "use_graphs": False}
PAGE = 16
SYSTEM_LEN, OWN_LEN, NEW = 40, 6, 4  # NOTE: 2 full shared pages; the 3rd mixes shared and own


def burst(groups: int, per_group: int) -> list[list[int]]:
    """``groups`` system prompts, each followed by ``per_group`` prompts in a row (not interleaved)."""
    rng = np.random.default_rng(7)
    systems = [[int(t) for t in rng.integers(0, 512, SYSTEM_LEN)] for _ in range(groups)]
    return [s + [int(t) for t in rng.integers(0, 512, OWN_LEN)] for s in systems for _ in range(per_group)]


def run(
    prompts: list[list[int]], caching: bool, **kw: object
) -> tuple[list[list[int]], list[dict[int, int]], dict[int, int]]:
    """All prompts submitted at once, stepped to the end. Returns the outputs, per step the
    requests it admitted (request id -> prompt tokens it computes) and each request's step of
    its first token (1-based)."""
    engine = Engine("tiny-llama", **(KW | {"max_batch_size": len(prompts)} | kw), prefix_caching=caching)
    ids = [engine.add_request(p, NEW) for p in prompts]
    seen: set[int] = set()
    admitted: list[dict[int, int]] = []
    first: dict[int, int] = {}
    while engine.waiting or engine.running:
        produced = engine.step()
        new = {r.rid: len(r.prompt) - r.cached for r in engine.running if r.rid not in seen}
        seen.update(new)
        admitted.append(new)
        for rid, _ in produced:
            first.setdefault(rid, len(admitted))
    assert sorted(engine.pool.unheld()) == list(range(engine.kv.dummy_page))  # nothing leaked
    return [engine.finished.pop(i).output for i in ids], admitted, first


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
def test_a_burst_over_several_prefixes_prefills_one_request_per_prefix_then_the_rest(overlap: bool) -> None:
    groups, per_group = 3, 3
    prompts = burst(groups, per_group)
    cold, off_admitted, off_first = run(prompts, False, overlap=overlap)
    warm, on_admitted, on_first = run(prompts, True, overlap=overlap)
    assert warm == cold
    heads = {g * per_group for g in range(groups)}
    full = SYSTEM_LEN + OWN_LEN
    # without caching every request is admitted at once, computing its whole prompt
    assert off_admitted[0] == dict.fromkeys(range(len(prompts)), full)
    # with it: the first request of each prefix computes its whole prompt in step 1 (the
    # others wait for its pages, not stopping the requests behind them), every other request
    # joins in step 2 computing only what follows the 2 cached pages
    assert on_admitted[0] == dict.fromkeys(heads, full)
    own = full - 2 * PAGE
    assert on_admitted[1] == {i: own for i in range(len(prompts)) if i not in heads}
    late = 1 if overlap else 0  # NOTE: an overlapped engine reads a step's tokens a step later
    assert max(off_first.values()) == 1 + late
    assert max(on_first.values()) == 2 + late


def test_a_request_waits_for_the_pages_a_chunked_prefill_computes() -> None:
    """With chunks of 16 the first prompt prefills over 3 steps: the others wait until its
    pages are cached and then hit them, instead of computing the shared pages again."""
    prompts = burst(1, 4)
    cold, _, _ = run(prompts, False, prefill_chunk=16)
    warm, admitted, _ = run(prompts, True, prefill_chunk=16)
    assert warm == cold
    computed = [n for step in admitted for n in step.values()]
    assert computed == [SYSTEM_LEN + OWN_LEN] + [SYSTEM_LEN + OWN_LEN - 2 * PAGE] * 3


def test_page_keys_are_hashed_once_per_request() -> None:
    """Two rows for eight requests: most wait many steps, each re-considered every step."""
    calls = []

    def counting(parent: int, tokens: tuple[int, ...]) -> int:
        calls.append(tokens)
        return chain_hash(parent, tokens)

    prompts = burst(2, 4)
    cold, _, _ = run(prompts, False, max_batch_size=2)
    engine = Engine("tiny-llama", **(KW | {"max_batch_size": 2}), prefix_caching=True)
    assert engine.pool.cache is not None
    engine.pool.cache.hash_fn = counting
    assert engine.generate(prompts, NEW) == cold
    assert len(calls) == sum(len(p) // PAGE for p in prompts)

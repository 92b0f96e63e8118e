"""Automatic prefix caching in the engine: the same greedy tokens with and without it (fp32
CPU, graphed and eager, across the tiny presets), hits counted, LRU eviction when pages run
out, a forced hash collision served as a miss, and what cannot combine refused at build time.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from graphrt import Engine

KW = {"device": "cpu", "max_batch_size": 4, "buckets": (1, 2, 4), "max_context_len": 128}
SYSTEM = [int(t) for t in np.random.default_rng(0).integers(0, 512, 40)]


def prompts(seed: int, lens: Sequence[int], system: Sequence[int] = SYSTEM) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [list(system) + [int(t) for t in rng.integers(0, 512, n)] for n in lens]


FIRST, LATER = prompts(1, (1, 7, 16)), [*prompts(2, (0, 3, 25, 9, 1)), SYSTEM[:33], SYSTEM[:32]]


def run(model: str, caching: bool, **kw: object) -> tuple[list[list[int]], Engine]:
    """Two calls: the second's prompts start with the first's cached pages."""
    engine = Engine(model, **(KW | kw), prefix_caching=caching)
    return engine.generate(FIRST, 6) + engine.generate(LATER, 6), engine


@pytest.mark.parametrize("graphs", [True, False], ids=["graph", "eager"])
def test_the_same_tokens_with_and_without_caching(graphs: bool) -> None:
    cold, off = run("tiny-llama", False, use_graphs=graphs)
    warm, on = run("tiny-llama", True, use_graphs=graphs)
    assert warm == cold
    assert off.stats().prefix is None
    stats = on.stats().prefix
    assert stats is not None
    # FIRST[1] shares FIRST[0]'s pages: it waits a step, then FIRST[1:] hit both of SYSTEM's
    # full pages (32 tokens), as every later prompt but SYSTEM[:32], which hits one page (its
    # last token is always computed)
    assert stats.hit_tokens == 32 * 2 + 32 * (len(LATER) - 1) + 16
    assert stats.hit_requests == 2 + len(LATER)
    assert stats.query_tokens == sum(len(p) for p in FIRST + LATER)
    assert stats.evictions == 0 and stats.collisions == 0
    assert sorted(on.pool.unheld()) == list(range(on.kv.dummy_page))  # nothing leaked


@pytest.mark.parametrize(
    ("model", "kw"),
    [
        ("tiny-llama-swa", {}),
        ("tiny-sinks", {}),
        ("tiny-llama-local", {}),
        ("tiny-mla", {}),
        ("tiny-llama", {"kv_cache_dtype": "fp8_e4m3"}),
        ("tiny-llama", {"overlap": False}),
        ("tiny-llama", {"record_logits": True}),
    ],
    ids=["window", "sinks", "chunked-local", "mla", "fp8-kv", "no-overlap", "record-logits"],
)
def test_caching_combines_with(model: str, kw: dict[str, object]) -> None:
    cold, _ = run(model, False, use_graphs=False, **kw)
    warm, engine = run(model, True, use_graphs=False, **kw)
    assert warm == cold
    stats = engine.stats().prefix
    assert stats is not None and stats.hit_requests == 2 + len(LATER)


def test_idle_pages_are_evicted_least_recently_used_first() -> None:
    """8 pages of 16; each request needs 3 (40 + 6 tokens): distinct system prompts evict."""
    kw = KW | {"max_batch_size": 2, "max_context_len": 64, "buckets": (1, 2)}
    systems = [[int(t) for t in np.random.default_rng(s).integers(0, 512, 34)] for s in range(4)]
    batches = [prompts(10 + s, (6,), systems[s]) for s in (0, 1, 2, 3, 0, 3)]
    outs = {}
    for caching in (False, True):
        engine = Engine("tiny-llama", **kw, prefix_caching=caching)
        outs[caching] = [engine.generate(b, 6) for b in batches]
    assert outs[True] == outs[False]
    stats = engine.stats().prefix
    assert stats is not None and stats.evictions > 0
    # the last prompt's system prompt was the most recently used: still cached, a hit
    assert stats.hit_requests >= 1 and stats.cached_pages <= engine.kv.dummy_page
    assert sorted(engine.pool.unheld()) == list(range(engine.kv.dummy_page))


def test_a_forced_hash_collision_is_a_miss_never_another_prompts_kv() -> None:
    """Every page gets the same key: the cache verifies tokens and parent, so a different
    prompt (or a different page of the same one) is refused as a hit."""
    cold, _ = run("tiny-llama", False, use_graphs=False)
    engine = Engine("tiny-llama", **KW, use_graphs=False)
    assert engine.pool.cache is not None
    engine.pool.cache.hash_fn = lambda parent, tokens: 0
    other = prompts(3, (5,), [int(t) for t in np.random.default_rng(9).integers(0, 512, 40)])
    assert engine.generate(FIRST, 6) + engine.generate(LATER, 6) == cold
    engine.generate(other, 6)
    stats = engine.stats().prefix
    assert stats is not None and stats.collisions > 0
    # only SYSTEM's first page can hold key 0: later prompts hit it, never a second page
    assert stats.hit_tokens == 16 * (2 + len(LATER))


@pytest.mark.parametrize(
    ("model", "kw", "named"),
    [
        ("tiny-llama", {"speculative": {"draft_model": "tiny-llama-draft", "num_steps": 2}}, "speculative"),
        ("tiny-cross", {}, "an encoder-decoder model"),
    ],
)
def test_what_cannot_combine_is_refused_at_build_time(model: str, kw: dict[str, object], named: str) -> None:
    with pytest.raises(ValueError, match=rf"prefix_caching=True does not combine with {named}"):
        Engine(model, **KW, use_graphs=False, prefix_caching=True, **kw)
    engine = Engine(model, **KW, use_graphs=False, **kw)  # NOTE: the default turns it off there
    assert engine.pool.cache is None and engine.stats().prefix is None


def test_on_by_default() -> None:
    engine = Engine("tiny-llama", **KW, use_graphs=False)
    assert engine.pool.cache is not None

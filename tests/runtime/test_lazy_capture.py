"""Lazy capture: each (mode, bucket) is captured on the step that first needs it, exactly once.

A lazy runtime and an eager one (same seed, same KV state) run the same steps over several
modes and buckets: every output is bit-equal (both replay a graph of the same ops on the same
values), the lazy one captured only the keys used, each once, and the rest stay pending. A
capture between steps leaves every live row's KV, request table and token feed untouched.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrt import Batch, ForwardMode, GraphFallbackError
from graphrt.step.modes import SpecGeometry
from tests.runtime.test_decode_parity import tolerance
from tests.runtime.test_spec_modes import draft_batch, filled, setup_for, verify_batch
from tests.support.util import Setup, build_runtime, decode_batch, next_lens, prefill, spec_batch

M = ForwardMode
SPEC = SpecGeometry(num_steps=3)
CPU = torch.device("cpu")


def _steps(s: Setup, lens: list[int]) -> list[Batch]:
    """DECODE, TARGET_VERIFY, DRAFT_DECODE, DRAFT_EXTEND and IDLE over buckets 1, 2 and 4,
    with repeats (a repeated key replays, never captures again)."""
    rng = np.random.default_rng(1)
    dec = lambda reqs: decode_batch(s, reqs, [lens[r] + 1 for r in reqs], rng)  # noqa: E731
    return [
        dec([0]),
        verify_batch(s, SPEC, [0, 2, 5], lens, rng),
        dec([0, 1, 2]),
        draft_batch(s, SPEC, [1, 3], lens, rng),
        spec_batch(s, M.DRAFT_EXTEND, [2], [lens[2] + 2], [2], rng),
        spec_batch(s, M.IDLE, [], [], [], rng),
        dec([4]),
        verify_batch(s, SPEC, [1, 4, 5], lens, rng),
        dec([0, 1, 2]),
    ]


def _run(lazy: bool) -> tuple[Setup, list[torch.Tensor]]:
    s = setup_for(CPU, SPEC, lazy=lazy)
    lens = filled(s, np.random.default_rng(7))
    return s, [s.runtime.run(b) for b in _steps(s, lens)]


@pytest.fixture(scope="module")
def runs() -> tuple[tuple[Setup, list[torch.Tensor]], tuple[Setup, list[torch.Tensor]]]:
    return _run(lazy=False), _run(lazy=True)


def test_lazy_and_eager_capture_give_the_same_outputs(runs) -> None:
    (_, eager), (_, lazy) = runs
    assert len(eager) == len(lazy) == 9
    for i, (a, b) in enumerate(zip(eager, lazy, strict=True)):
        assert torch.equal(a, b), f"step {i}: lazy capture changed the output"


def test_each_key_is_captured_once_on_first_use(runs) -> None:
    (es, _), (ls, _) = runs
    eager, lazy = es.runtime.stats(), ls.runtime.stats()
    assert lazy.replays == eager.replays and lazy.fallbacks == eager.fallbacks == {}
    assert eager.captures == {
        m: {1: 1, 2: 1, 4: 1} for m in ("DECODE", "DRAFT_DECODE", "DRAFT_EXTEND", "IDLE", "TARGET_VERIFY")
    }
    used = {
        "DECODE": {1: 1, 4: 1},
        "TARGET_VERIFY": {4: 1},
        "DRAFT_DECODE": {2: 1},
        "DRAFT_EXTEND": {1: 1},
        "IDLE": {1: 1},
    }
    assert lazy.captures == used
    report = ls.runtime.report()
    assert report.policy == "lazy" and len(report.graphs) == 6
    pending = {(m.name, b) for m, b in report.pending}
    everything = {(m, b) for m in eager.captures for b in (1, 2, 4)}
    assert pending == everything - {(m, b) for m, bs in used.items() for b in bs}
    assert es.runtime.report().pending == ()


def test_a_lazily_captured_graph_is_the_eager_one(runs) -> None:
    (es, _), (ls, _) = runs
    for key, graph in ls.runtime.dispatcher.graphs.items():
        twin = es.runtime.dispatcher.graphs[key].info
        assert graph.info.host_scalars == twin.host_scalars, key
        assert graph.info.num_nodes == twin.num_nodes and graph.info.kernels == twin.kernels, key


def _live_state(s: Setup) -> tuple[torch.Tensor, ...]:
    """Every live page of K and V (the dummy page is the last), the request table, each row's
    valid length and last sampled token (the dummy row, the table's last, left out)."""
    kv = tuple(t[: s.kv.dummy_page].clone() for t in (*s.kv.k, *s.kv.v))
    rows = s.req_to_token.max_reqs
    feed = s.runtime.tokens
    assert feed is not None and feed.dummy == rows
    valid = torch.as_tensor(s.req_to_token.ledger.valid_lens[:rows].copy())
    return (*kv, s.req_to_token.table[:rows].clone(), valid, feed.last[:rows].clone())


def test_a_capture_between_steps_leaves_live_rows_untouched() -> None:
    s = build_runtime(CPU, max_batch_size=8, buckets=(1, 8), sample=True, lazy=True)
    prefill(s, [0, 1, 2], [5, 9, 3], np.random.default_rng(0))
    before = _live_state(s)
    s.runtime.capturer.on_first_use(M.DECODE, 8)  # NOTE: what a step of 5..8 requests does first
    after = _live_state(s)
    for i, (a, b) in enumerate(zip(before, after, strict=True)):
        assert torch.equal(a, b), f"state {i} changed by a capture"
    assert (M.DECODE, 8) in s.runtime.dispatcher.graphs and s.runtime.stats().captures == {"DECODE": {8: 1}}


def test_debug_poison_and_strict_pass_with_lazy_capture() -> None:
    s = build_runtime(CPU, max_batch_size=4, buckets=(1, 4), debug=True, strict=True, lazy=True)
    oracle = build_runtime(CPU, max_batch_size=4, capture=False)
    rows = list(range(4))
    for setup in (s, oracle):
        prefill(setup, rows, [4 + r for r in rows], np.random.default_rng(0))
    for seed, reqs in enumerate([rows[:1], rows[:3], rows[:1], rows[:4]]):
        batch = decode_batch(s, reqs, next_lens(s, reqs), np.random.default_rng(seed))
        got = s.runtime.run(batch)  # NOTE: debug: PoisonLeft if the update missed a buffer
        torch.testing.assert_close(got, oracle.runtime.run(batch), **tolerance(CPU))
    assert s.runtime.stats().captures == {"DECODE": {1: 1, 4: 1}}
    assert s.runtime.stats().replays == {"DECODE": 4}


def test_a_failed_capture_runs_eagerly_and_is_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    s = build_runtime(CPU, max_batch_size=4, buckets=(1, 4), lazy=True)
    oracle = build_runtime(CPU, max_batch_size=4, capture=False)
    for setup in (s, oracle):
        prefill(setup, [0, 1, 2], [4, 5, 6], np.random.default_rng(0))
    capture = s.runtime.capturer.engine.capture

    def failing(key, fn, warmup):  # type: ignore[no-untyped-def]
        if key == (M.DECODE, 4):
            raise RuntimeError("out of memory (injected)")
        return capture(key, fn, warmup)

    monkeypatch.setattr(s.runtime.capturer.engine, "capture", failing)
    for seed in range(2):
        batch = decode_batch(s, [0, 1, 2], next_lens(s, [0, 1, 2]), np.random.default_rng(seed))
        torch.testing.assert_close(s.runtime.run(batch), oracle.runtime.run(batch), **tolerance(CPU))
    why = "capture of DECODE bs=4 failed: RuntimeError: out of memory (injected)"
    assert s.runtime.stats().fallbacks == {"DECODE": {why: 2}}
    assert s.runtime.report().pending == ((M.DECODE, 1),) and s.runtime.stats().captures == {}
    batch = decode_batch(s, [0], next_lens(s, [0]), np.random.default_rng(5))
    s.runtime.run(batch)
    assert s.runtime.stats().captures == {"DECODE": {1: 1}}  # NOTE: other keys still capture


def test_another_ranks_failure_drops_the_graph_here_too() -> None:
    s = build_runtime(CPU, max_batch_size=4, buckets=(1, 4), lazy=True, strict=True)
    seen: list[tuple[bool, str]] = []

    def others_failed(ok: bool, what: str) -> bool:
        seen.append((ok, what))
        return False

    s.runtime.capturer.agree = others_failed
    prefill(s, [0], [4], np.random.default_rng(0))
    batch = decode_batch(s, [0], next_lens(s, [0]), np.random.default_rng(1))
    with pytest.raises(
        GraphFallbackError, match="capture of DECODE bs=1 failed: another rank's capture failed"
    ):
        s.runtime.run(batch)
    assert seen == [(True, "lazy capture of DECODE bs=1")]
    assert not s.runtime.dispatcher.graphs and s.runtime.stats().captures == {}


def test_release_drops_pending_keys_and_capture_pending_takes_the_rest() -> None:
    s = build_runtime(CPU, max_batch_size=2, buckets=(1, 2), lazy=True)
    prefill(s, [0, 1], [4, 5], np.random.default_rng(0))
    s.runtime.run(decode_batch(s, [0], next_lens(s, [0]), np.random.default_rng(1)))
    report = s.runtime.capture_pending()
    assert report.pending == () and sorted(b for _, b in s.runtime.dispatcher.graphs) == [1, 2]
    assert s.runtime.stats().captures == {"DECODE": {1: 1, 2: 1}}
    s.runtime.release()  # NOTE: after a release no step may capture (a process group may be gone)
    s.runtime.run(decode_batch(s, [0, 1], next_lens(s, [0, 1]), np.random.default_rng(2)))
    assert s.runtime.stats().fallbacks == {"DECODE": {"mode DECODE not captured": 1}}
    assert s.runtime.report().pending == () and s.runtime.stats().captures == {"DECODE": {1: 1, 2: 1}}


def test_a_token_bucketed_mode_is_captured_on_first_use_too() -> None:
    """MIXED (buckets count tokens): a lazy runtime captures only the token bucket a step needs,
    and its output equals the eager runtime's bit for bit."""
    from tests.runtime.test_mixed_mode import TOKEN_BUCKETS, fill, mixed_batch

    outs, stats = [], []
    for lazy in (False, True):
        s = build_runtime(CPU, modes=(M.MIXED,), token_buckets=TOKEN_BUCKETS, max_batch_size=4, lazy=lazy)
        fill(s, [0, 1, 2], [9, 30, 0])
        outs.append(s.runtime.run(mixed_batch(s, [0, 1, 2], [9, 30], [(0, 6)])))
        stats.append(s.runtime.stats())
    assert torch.equal(outs[0], outs[1])
    assert stats[0].captures == {"MIXED": {4: 1, 8: 1, 16: 1}}
    assert stats[1].captures == {"MIXED": {8: 1}} and stats[1].replays == {"MIXED": 1}

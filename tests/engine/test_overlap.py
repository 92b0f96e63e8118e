"""The overlapped engine (host one step ahead, input ids fed on the device) gives the tokens of
the plain engine: graphs and eager, greedy and seeded sampling, stop tokens, budgets, row reuse.

Exact equality across schedules relies on batch-invariant float32 logits on the CPU (see
test_engine and test_sampling): a stop token is seen one step late, so the overlapped engine's
batches may hold one extra row for a step.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
import pytest
import torch

from graphrt import Batch, Engine, ForwardMode, SamplingParams
from tests.conftest import DEVICES

MAX_BS = 4
KW = {"device": "cpu", "max_batch_size": MAX_BS, "max_context_len": 96, "buckets": (1, 2, 4)}
LENS = (3, 9, 1, 17, 6, 12, 2, 25, 7, 4)
MAX_NEW = [6, 11, 1, 9, 4, 13, 2, 8, 10, 5]  # NOTE: finishes at many different steps
PROMPTS = [np.random.default_rng(i).integers(0, 512, n).tolist() for i, n in enumerate(LENS)]
SEEDED = [SamplingParams(temperature=1.2, top_p=0.95, seed=40 + i) for i in range(len(PROMPTS))]


class Log:
    """Every step the runtime ran: mode, request rows, and whether its ids were device-fed."""

    def __init__(self, engine: Engine) -> None:
        self.steps: list[tuple[ForwardMode, list[int], bool]] = []
        run = engine.runtime.run

        def logged(batch: Batch, *, eager: bool = False, feed: object = None) -> torch.Tensor:
            fed = bool(getattr(feed, "gather", False))
            self.steps.append((batch.mode, batch.req_pool_indices.tolist(), fed))
            return run(batch, eager=eager, feed=feed)  # type: ignore[arg-type]

        engine.runtime.run = logged  # type: ignore[method-assign]

    def rows_used(self) -> Counter[int]:
        """How many requests each row held (one prefill each: EXTEND, or MIXED replayed)."""
        prefills = (ForwardMode.EXTEND, ForwardMode.MIXED)
        return Counter(r for mode, rows, _ in self.steps if mode in prefills for r in rows)


def engine(use_graphs: bool, overlap: bool) -> tuple[Engine, Log]:
    e = Engine(use_graphs=use_graphs, overlap=overlap, **KW)  # type: ignore[arg-type]
    return e, Log(e)


@pytest.fixture(scope="module")
def engines() -> dict[tuple[bool, bool], tuple[Engine, Log]]:
    """(use_graphs, overlap) -> engine and its step log."""
    return {(g, o): engine(g, o) for g in (True, False) for o in (True, False)}


def drive(
    e: Engine, waves: Sequence[tuple[int, int]], params: Sequence[SamplingParams | None]
) -> list[list[int]]:
    """Add PROMPTS[lo:hi] per wave, stepping until at most one request runs before the next;
    returns each prompt's tokens as ``step()`` reported them (checked against ``finished``)."""
    produced: dict[int, list[int]] = {}
    order: list[int] = []
    for lo, hi in waves:
        order += [e.add_request(PROMPTS[i], MAX_NEW[i], params[i]) for i in range(lo, hi)]
        while e.waiting or len(e.running) > 1:
            for rid, t in e.step():
                produced.setdefault(rid, []).append(t)
    while e.running:
        for rid, t in e.step():
            produced.setdefault(rid, []).append(t)
    assert e.step() == []  # NOTE: a stopped request's extra token is dropped, never reported
    assert all(e.finished[rid].output == produced[rid] for rid in order)
    return [produced[rid] for rid in order]


WAVES = [(0, 2), (2, 7), (7, 10)]  # arrivals while others decode


def test_greedy_continuous_batching_same_tokens(engines: dict) -> None:
    plain = drive(engines[(True, False)][0], WAVES, [None] * len(PROMPTS))
    assert [len(o) for o in plain] == MAX_NEW
    for key in ((True, True), (False, True), (False, False)):
        assert drive(engines[key][0], WAVES, [None] * len(PROMPTS)) == plain, key
    log = engines[(True, True)][1]
    assert max(log.rows_used().values()) > 1  # rows were reused by later requests
    decodes = [fed for mode, _, fed in log.steps if mode is ForwardMode.DECODE]
    assert decodes and all(decodes)  # every overlapped decode took its ids from the device


def test_budgets_schedule_exactly_as_without_overlap(engines: dict) -> None:
    """Without stop tokens the overlapped engine runs batches of the same sizes in the same
    order (no extra step); which free row a request gets may differ with earlier history."""
    runs = {}
    for key in ((True, True), (True, False)):
        e, log = engines[key]
        log.steps.clear()
        runs[key] = (e.generate(PROMPTS, MAX_NEW), [(m, len(rows)) for m, rows, _ in log.steps])
    assert runs[(True, True)] == runs[(True, False)]


def stop_params(full: list[list[int]], temperature: float = 0.0) -> list[SamplingParams]:
    """Each request stops at its third token (a token id, so maybe earlier); seeded if sampled."""
    return [
        SamplingParams(temperature, seed=40 + i, stop_token_ids=(out[min(2, len(out) - 1)],))
        for i, out in enumerate(full)
    ]


@pytest.mark.parametrize("temperature", [0.0, 1.2])
def test_stop_tokens_same_tokens_extra_step_dropped(engines: dict, temperature: float) -> None:
    plain_engine = engines[(True, False)][0]
    full = plain_engine.generate(PROMPTS, MAX_NEW, SEEDED if temperature else None)
    params = stop_params(full, temperature)
    expected = drive(plain_engine, WAVES, params)
    for key in ((True, True), (False, True)):
        e, log = engines[key]
        log.steps.clear()
        out = drive(e, WAVES, params)
        assert out == expected, key
        stopped = [i for i, o in enumerate(out) if len(o) < MAX_NEW[i]]
        assert stopped  # NOTE: stop tokens ended some requests early
        for i in stopped:
            first = min(full[i].index(t) for t in params[i].stop_token_ids)
            assert out[i] == full[i][: first + 1]
        # the step after a stop ran once more for that request, then its row was freed
        decoded = sum(len(rows) for m, rows, _ in log.steps if m is ForwardMode.DECODE)
        assert decoded > sum(len(o) - 1 for o in out)
        ledger = e.runtime.req_to_token.ledger
        assert not ledger.valid_lens.any() and not ledger.refs[~ledger.pinned].any()  # every row freed
        assert (ledger.refs[ledger.pinned] == 1).all()  # NOTE: cached prefix pages: the cache's pin only
        assert not e.running and not e.waiting and e.overlap is not None


def test_seeded_sampling_same_tokens(engines: dict) -> None:
    plain = engines[(True, False)][0].generate(PROMPTS, MAX_NEW, SEEDED)
    assert plain != engines[(True, False)][0].generate(PROMPTS, MAX_NEW)  # it does sample
    for key in ((True, True), (False, True)):
        assert engines[key][0].generate(PROMPTS, MAX_NEW, SEEDED) == plain, key


def test_step_reports_tokens_one_step_late(engines: dict) -> None:
    e = engines[(True, True)][0]
    rid = e.add_request(PROMPTS[1], 3)
    assert e.step() == []  # the prefill is launched; nothing is read yet
    got = e.step()  # decode launched, the prefill's token read
    assert [r for r, _ in got] == [rid]
    rest = e.step() + e.step()  # the last token is launched with the second decode
    assert [r for r, _ in rest] == [rid, rid] and e.step() == [] and not e.running
    assert e.finished[rid].output == [t for _, t in got + rest]
    stats = e.stats()
    assert stats.decode_steps > 0 and stats.generated_tokens >= 3


def test_overlap_refused_where_unsupported() -> None:
    with pytest.raises(ValueError, match=r"overlap=True is not supported with speculative decoding"):
        Engine(overlap=True, speculative={"draft_model": "tiny-llama-draft", "num_steps": 1}, **KW)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"overlap=True is not supported with record_logits=True"):
        Engine(overlap=True, record_logits=True, use_graphs=False, **KW)  # type: ignore[arg-type]
    spec = Engine(speculative={"draft_model": "tiny-llama-draft", "num_steps": 1}, use_graphs=False, **KW)  # type: ignore[arg-type]
    assert spec.overlap is None  # NOTE: the default: speculative rounds stay synchronous
    assert Engine(use_graphs=False, **KW).overlap is not None  # type: ignore[arg-type]
    assert Engine(use_graphs=False, overlap=False, **KW).overlap is None  # type: ignore[arg-type]


def test_runtime_feed_needs_sampled_tokens(engines: dict) -> None:
    e = engines[(False, True)][0]
    assert e.overlap is not None
    batch = Batch.create(
        ForwardMode.DECODE, input_ids=[0], seq_lens=[1], req_pool_indices=[0], out_cache_loc=[0]
    )
    with pytest.raises(ValueError, match=r"the batch needs Batch\.sampling"):
        e.runtime.run(batch, feed=e.overlap.feed.decode)


@pytest.mark.parametrize("device", [DEVICES[1]])
def test_overlap_same_tokens_on_cuda(device: str) -> None:
    """bf16 on a GPU: budgets only, so both engines run identical batches (identical GEMM shapes),
    graphs and the eager prefill alike; seeded sampling too."""
    kw = {**KW, "device": device}
    runs = []
    for overlap in (False, True):
        e = Engine(overlap=overlap, **kw)  # type: ignore[arg-type]
        runs.append((e.generate(PROMPTS, MAX_NEW), e.generate(PROMPTS, MAX_NEW, SEEDED)))
        assert (e.overlap is not None) == overlap
    assert runs[0] == runs[1]

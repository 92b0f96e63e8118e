"""graphrt.Engine on CPU: graphs and eager generate the same tokens under continuous batching.

Exact token equality is safe here: graph and eager logits differ by ~3e-6 in float32 (see
test_decode_parity), while the smallest top-1/top-2 logit margin over every step of these
prompts is 2.0e-3 (measured with record_logits=True), so no argmax can flip.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from graphrt import Batch, Engine, ForwardMode

MAX_BS = 8
BUCKETS = (1, 2, 4, 8)
CONTEXT = 256
PROMPT_LENS = (1, 3, 5, 8, 13, 16, 17, 20, 2, 31, 7, 4, 33, 11, 6, 9, 15, 24)
MAX_NEW = [5, 12, 3, 20, 7, 9, 15, 2, 11, 6, 18, 4, 10, 8, 14, 1, 13, 16]


def make_prompts(lens: Sequence[int], seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(0, 512, n)] for n in lens]


PROMPTS = make_prompts(PROMPT_LENS)


@dataclass
class Recorded:
    """What the engine's runtime was asked to run, step by step."""

    modes: list[ForwardMode] = field(default_factory=list)
    decode_sizes: list[int] = field(default_factory=list)


def record(engine: Engine) -> Recorded:
    """Wrap ``engine.runtime.run`` to log each step's mode and decode batch size."""
    log, run = Recorded(), engine.runtime.run

    def logged(batch: Batch, *, eager: bool = False, **kw: object) -> torch.Tensor:
        log.modes.append(batch.mode)
        if batch.mode is ForwardMode.DECODE:
            log.decode_sizes.append(batch.bs)
        return run(batch, eager=eager, **kw)  # type: ignore[arg-type]

    engine.runtime.run = logged  # type: ignore[method-assign]
    return log


def bucket_of(bs: int) -> int:
    return next(b for b in BUCKETS if b >= bs)


@dataclass
class Run:
    engine: Engine
    outputs: list[list[int]]
    log: Recorded


def generate(use_graphs: bool, **kwargs: object) -> Run:
    engine = Engine(
        device="cpu", use_graphs=use_graphs, max_batch_size=MAX_BS, max_context_len=CONTEXT, **kwargs
    )  # type: ignore[arg-type]
    log = record(engine)
    return Run(engine, engine.generate(PROMPTS, MAX_NEW), log)


@pytest.fixture(scope="module")
def graph_run() -> Run:
    return generate(use_graphs=True)


@pytest.fixture(scope="module")
def eager_run() -> Run:
    return generate(use_graphs=False)


def test_graphs_and_eager_generate_the_same_tokens(graph_run: Run, eager_run: Run) -> None:
    assert len(PROMPTS) >= 16 and len(set(PROMPT_LENS)) == len(PROMPT_LENS)
    assert graph_run.outputs == eager_run.outputs
    assert [len(o) for o in graph_run.outputs] == MAX_NEW
    assert all(0 <= t < 512 for o in graph_run.outputs for t in o)
    # both runs scheduled identically: same prefill/decode sequence (a prefill that fits a token
    # bucket replays a MIXED graph: every prefill here)
    assert [
        ForwardMode.EXTEND if m is ForwardMode.MIXED else m for m in graph_run.log.modes
    ] == eager_run.log.modes


def test_continuous_batching_covers_every_bucket(graph_run: Run) -> None:
    log = graph_run.log
    # new requests are admitted (a prefill) after decoding has started, as others finish
    first_decode = log.modes.index(ForwardMode.DECODE)
    assert ForwardMode.MIXED in log.modes[first_decode:]
    assert max(log.decode_sizes) == MAX_BS
    assert set(log.decode_sizes) == set(range(1, MAX_BS + 1))  # the tail shrinks through all sizes
    graphs = graph_run.engine.runtime.dispatcher.graphs
    per_bucket = {b: graphs[(ForwardMode.DECODE, b)].info.replays for b in BUCKETS}
    expected = {b: sum(bucket_of(n) == b for n in log.decode_sizes) for b in BUCKETS}
    assert per_bucket == expected
    assert all(n > 0 for n in per_bucket.values())


def test_stats_with_graphs(graph_run: Run) -> None:
    stats = graph_run.engine.stats()
    assert stats.decode_steps == len(graph_run.log.decode_sizes) > 0
    assert stats.replays == {"DECODE": stats.decode_steps, "MIXED": stats.prefill_steps}
    assert stats.eager == {}  # NOTE: every prefill fits a MIXED graph
    assert stats.fallbacks == {}
    assert stats.generated_tokens == sum(MAX_NEW)
    report = graph_run.engine.capture_report
    assert report is not None
    assert [g.key[1] for g in report.graphs if g.key[0] is ForwardMode.DECODE] == [8, 4, 2, 1]


def test_stats_without_graphs(eager_run: Run) -> None:
    stats = eager_run.engine.stats()
    assert stats.replays == {}
    assert stats.eager == {"EXTEND": stats.prefill_steps, "DECODE": stats.decode_steps}
    assert stats.decode_steps == len(eager_run.log.decode_sizes) > 0
    assert stats.fallbacks == {}
    assert stats.generated_tokens == sum(MAX_NEW)
    assert eager_run.engine.capture_report is None


def drive(engine: Engine, waves: Sequence[tuple[int, int]]) -> dict[int, list[int]]:
    """Add PROMPTS[lo:hi] per wave, stepping until at most one request runs before the next.

    Returns each request's tokens as reported by ``step()``, keyed by prompt index.
    """
    produced: dict[int, list[int]] = {}
    index_of: dict[int, int] = {}
    for lo, hi in waves:
        for i in range(lo, hi):
            index_of[engine.add_request(PROMPTS[i], MAX_NEW[i])] = i
        while engine.waiting or len(engine.running) > 1:
            for rid, token in engine.step():
                produced.setdefault(index_of[rid], []).append(token)
    while engine.running:
        for rid, token in engine.step():
            produced.setdefault(index_of[rid], []).append(token)
    assert engine.step() == []
    for rid, i in index_of.items():
        assert engine.finished[rid].output == produced[i]
    return produced


@pytest.mark.slow
def test_step_interface_matches_generate(graph_run: Run) -> None:
    engine = Engine(device="cpu", use_graphs=True, max_batch_size=MAX_BS, max_context_len=CONTEXT)
    log = record(engine)
    waves = [(0, 3), (3, 14), (14, 16), (16, len(PROMPTS))]  # arrivals at different times
    produced = drive(engine, waves)
    assert [produced[i] for i in range(len(PROMPTS))] == graph_run.outputs
    buckets = [bucket_of(n) for n in log.decode_sizes]
    grows = [(a, b) for a, b in itertools.pairwise(buckets) if b > a]
    shrinks = [(a, b) for a, b in itertools.pairwise(buckets) if b < a]
    assert grows and shrinks, f"decode sizes never crossed buckets both ways: {log.decode_sizes}"
    stats = engine.stats()
    assert stats.replays == {"DECODE": stats.decode_steps, "MIXED": stats.prefill_steps}
    assert stats.fallbacks == {} and stats.eager == {}


@pytest.mark.slow
def test_page_size_1() -> None:
    prompts, max_new = make_prompts((1, 9, 4, 17, 2, 12), seed=1), [6, 3, 9, 1, 7, 5]
    outputs = []
    for use_graphs in (True, False):
        engine = Engine(
            device="cpu", use_graphs=use_graphs, max_batch_size=4, page_size=1, max_context_len=32
        )
        outputs.append(engine.generate(prompts, max_new))
        stats = engine.stats()
        assert stats.fallbacks == {}
        assert stats.eager.get("DECODE", 0) == (0 if use_graphs else stats.decode_steps)
        assert stats.replays.get("DECODE", 0) == (stats.decode_steps if use_graphs else 0)
    assert outputs[0] == outputs[1]
    assert [len(o) for o in outputs[0]] == max_new

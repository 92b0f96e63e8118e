"""Split pairs: a constrained DECODE step (``run(ready=...)``) on a runtime with token masks
replays its forward graph, then calls ``ready`` (which writes the step's masks), then replays
its sampler graph; a step without ``ready`` replays the single graph.

Tokens equal the eager path's exactly (it runs the same program fused, ``ready`` before it: fp32
on the CPU, tests/runtime/test_feed.py), log-probabilities to 1e-5 (a bucket's padded rows move
the last ulp, as they do for the single graph); against the single graph of the same bucket
(``ready`` before it) tokens and log-probabilities are bit-equal. Each step's allowed sets are
disjoint from the step before's, so a sampler that read the masks before ``ready`` wrote them
would draw outside them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch

from graphrt import Batch, ForwardMode, SamplingParams
from graphrt.cli import main
from graphrt.debug.snapshot import load_snapshot, take_snapshot
from graphrt.runtime import programs
from graphrt.runtime.token_mask import ALL
from graphrt.step import FED
from tests.support.util import Setup, build_runtime, slot_of

CPU = torch.device("cpu")
ROWS = [0, 1, 2]
PROMPT_LENS = [4, 6, 5]
#: Greedy; sampled and unconstrained; sampled with top-k and a repetition penalty.
PARAMS = (
    SamplingParams(),
    SamplingParams(temperature=0.9, seed=5),
    SamplingParams(temperature=0.7, top_k=20, seed=9, repetition_penalty=1.3),
)
CONSTRAINED = (0, 2)  # NOTE: row 1 stays all-allowed
STEPS = 5
FREE_STEP = 2  # NOTE: a step without ready: the single graph, on the step before's masks


def setup(buckets: tuple[int, ...] = (1, 2, 4), **kw: object) -> Setup:
    return build_runtime(
        CPU,
        max_batch_size=4,
        max_reqs=4,
        max_context_len=64,
        buckets=buckets,
        sample=True,
        token_masks=True,
        penalties=True,
        logprobs=2,
        **kw,
    )


def allowed(step: int, row: int) -> set[int]:
    """The tokens row ``row`` may sample at DECODE step ``step`` (disjoint from step - 1's)."""
    lo = 40 * step + 13 * row
    return set(range(lo, lo + 10))


def write_masks(s: Setup, rows: list[int], sets: list[set[int] | None]) -> None:
    """Row ``rows[i]`` may sample ``sets[i]`` only (None: every token)."""
    masks = s.runtime.env.masks
    assert masks is not None
    _, host = masks.staging()
    for i, chosen in enumerate(sets):
        host[i] = ALL
        if chosen is not None:
            bits = np.zeros(masks.words, dtype=np.int64)
            for j in chosen:
                bits[j // 32] |= 1 << (j % 32)
            host[i] = bits.astype(np.uint32).view(np.int32)
    masks.upload(np.asarray(rows, dtype=np.int64))


def forward_lead(s: Setup) -> int:
    """Forward-graph replays not yet followed by their sampler's, over every split pair."""
    pairs = s.runtime.capturer.variants["split"].made.values()
    return sum(p.first.info.replays - p.second.info.replays for p, _ in pairs)


@dataclass
class Trajectory:
    tokens: list[list[int]] = field(default_factory=list)
    logprobs: list[np.ndarray] = field(default_factory=list)
    #: :func:`forward_lead` each time ``ready`` ran.
    leads: list[int] = field(default_factory=list)


def trajectory(s: Setup, eager: bool, constrained: bool = True) -> Trajectory:
    """Fresh requests in :data:`ROWS`, then :data:`STEPS` fed DECODE steps, each but
    :data:`FREE_STEP` writing the constrained rows' masks in its ``ready``."""
    rt, out = s.runtime, Trajectory()
    assert rt.tokens is not None and rt.env.counts is not None
    prompts = [
        np.random.default_rng(7 + r).integers(0, s.model.vocab_size, n)
        for r, n in zip(ROWS, PROMPT_LENS, strict=True)
    ]
    for r in ROWS:
        s.req_to_token.free(r)
    rt.env.counts.start(ROWS, [p.tolist() for p in prompts])
    write_masks(s, ROWS, [None] * len(ROWS))
    extend = Batch.create(
        ForwardMode.EXTEND,
        input_ids=np.concatenate(prompts),
        seq_lens=PROMPT_LENS,
        req_pool_indices=ROWS,
        out_cache_loc=[slot_of(s, r, p) for r, n in zip(ROWS, PROMPT_LENS, strict=True) for p in range(n)],
        q_lens=PROMPT_LENS,
        sampling=PARAMS,
    )
    rt.run(extend, feed=rt.tokens.prefill)
    for i in range(STEPS):
        seq = [n + 1 + i for n in PROMPT_LENS]
        batch = Batch.create(
            ForwardMode.DECODE,
            input_ids=[FED] * len(ROWS),
            seq_lens=seq,
            req_pool_indices=ROWS,
            out_cache_loc=[slot_of(s, r, n - 1) for r, n in zip(ROWS, seq, strict=True)],
            sampling=PARAMS,
        )

        def ready(step: int = i) -> None:
            out.leads.append(forward_lead(s))
            write_masks(s, list(CONSTRAINED), [allowed(step, r) for r in CONSTRAINED])

        use = ready if constrained and i != FREE_STEP else None
        out.tokens.append(rt.run(batch, eager=eager, feed=rt.tokens.decode, ready=use).tolist())
        assert rt.logprobs is not None
        out.logprobs.append(rt.logprobs.clone().numpy())
    return out


def check_allowed(got: Trajectory) -> None:
    for i, tokens in enumerate(got.tokens):
        step = i - 1 if i == FREE_STEP else i  # NOTE: the free step keeps the masks before it
        for r in CONSTRAINED:
            assert tokens[r] in allowed(step, r), (i, r, tokens)


@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug-poison"])
def test_constrained_steps_replay_the_split_pair_with_the_eager_tokens(debug: bool) -> None:
    s = setup(debug=debug)
    keys = {g.key for g in s.runtime.report().graphs}
    decode = ForwardMode.DECODE
    assert {(decode, 4, "forward"), (decode, 4, "sampler"), (decode, 1, "sampler"), (decode, 4)} <= keys
    pair, _ = s.runtime.capturer.variants["split"].made[(decode, 4)]
    scalars = s.runtime.dispatcher.graphs[(decode, 4)].info.host_scalars
    assert [p.info.host_scalars for p in pair.parts] == [scalars, scalars]  # NOTE: rule 4, both parts
    want = trajectory(s, eager=True)
    assert want.leads == [0] * (STEPS - 1)
    check_allowed(want)
    before = s.runtime.stats()
    fused = s.runtime.dispatcher.graphs[(decode, 4)].info.replays
    got = trajectory(s, eager=False)
    assert got.tokens == want.tokens
    for a, b in zip(got.logprobs, want.logprobs, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
    # NOTE: ready ran after the forward's replay and before the sampler's, every constrained step
    assert got.leads == [1] * (STEPS - 1) and forward_lead(s) == 0
    stats = s.runtime.stats()
    assert stats.split == {"DECODE": STEPS - 1}
    assert stats.replays["DECODE"] - before.replays.get("DECODE", 0) == STEPS
    assert s.runtime.dispatcher.graphs[(decode, 4)].info.replays - fused == 1  # NOTE: the free step
    # NOTE: the unconstrained row samples what it does in a batch without masks
    free = trajectory(s, eager=False, constrained=False)
    assert [t[1] for t in got.tokens] == [t[1] for t in free.tokens]
    assert free.leads == [] and s.runtime.stats().split == {"DECODE": STEPS - 1}


def test_a_lazy_runtime_captures_a_split_pair_on_its_first_constrained_step() -> None:
    s = setup(lazy=True)
    assert s.runtime.report().graphs == ()
    want = trajectory(s, eager=True)
    got = trajectory(s, eager=False)
    assert got.tokens == want.tokens and got.leads == [1] * (STEPS - 1)
    decode = ForwardMode.DECODE
    keys = {g.key for g in s.runtime.report().graphs}
    assert keys == {(decode, 4), (decode, 4, "forward"), (decode, 4, "sampler")}
    s.runtime.capture_pending()
    keys = {g.key for g in s.runtime.report().graphs}
    assert keys == {
        (decode, b, *part) for b in (1, 2, 4) for part in ((), ("forward",), ("sampler",), ("lean",))
    }


def test_the_pair_equals_the_single_graph_which_a_failed_pair_capture_leaves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A runtime whose pair capture fails replays the single graph, ``ready`` first: its tokens
    and log-probabilities are bit-equal to the pair's (same bucket, same ops)."""
    paired = setup()

    def broken(*args: object) -> torch.Tensor:
        raise RuntimeError("no forward here")

    split = programs.SPLITS[ForwardMode.DECODE]
    monkeypatch.setitem(programs.SPLITS, ForwardMode.DECODE, programs.SplitProgram(broken, split.sample))
    single = setup(lazy=True)
    want, got = trajectory(single, eager=False), trajectory(paired, eager=False)
    assert want.leads == [0] * (STEPS - 1) and got.leads == [1] * (STEPS - 1)
    assert got.tokens == want.tokens
    for a, b in zip(got.logprobs, want.logprobs, strict=True):
        assert np.array_equal(a, b)
    check_allowed(got)
    assert single.runtime.stats().split == {} and "DECODE" not in single.runtime.stats().eager
    assert "no forward here" in single.runtime.capturer.variants["split"].failed[(ForwardMode.DECODE, 4)]
    assert {len(g.key) for g in single.runtime.report().graphs} == {2}


def test_a_runtime_without_masks_captures_no_split_pair() -> None:
    s = build_runtime(CPU, max_batch_size=4, max_context_len=64, buckets=(1, 2, 4), sample=True)
    keys = {g.key for g in s.runtime.report().graphs}
    assert (
        keys == {(ForwardMode.DECODE, b) for b in (1, 2, 4)}
        and not s.runtime.capturer.variants["split"].modes
    )


def test_inspect_shows_the_pair_under_its_parts_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s = setup(buckets=(4,))
    trajectory(s, eager=False)
    path = tmp_path / "split.json"
    take_snapshot(s.runtime, str(path), environment={"device": "cpu", "torch": torch.__version__})
    snap = load_snapshot(path)
    assert [(g.mode, g.bucket, g.replays) for g in snap.graphs] == [
        ("DECODE", 4, 1),
        ("DECODE.forward", 4, STEPS - 1),
        ("DECODE.sampler", 4, STEPS - 1),
        ("DECODE.lean", 4, 0),
    ]
    assert main(["inspect", str(path), "--width", "160", "--no-kernels"]) == 0
    rows = [ln.split("│")[1].strip() for ln in capsys.readouterr().out.splitlines() if "│ DECODE" in ln]
    assert {"DECODE.forward", "DECODE.sampler"} <= set(rows)


def test_recapture_and_release_replace_and_drop_the_pairs() -> None:
    s = setup()
    want = trajectory(s, eager=True)
    s.runtime.recapture([2, 4])
    decode = ForwardMode.DECODE
    keys = {g.key for g in s.runtime.report().graphs}
    assert keys == {
        (decode, b, *part) for b in (2, 4) for part in ((), ("forward",), ("sampler",), ("lean",))
    }
    got = trajectory(s, eager=False)
    assert got.tokens == want.tokens and got.leads == [1] * (STEPS - 1)
    s.runtime.release()
    assert s.runtime.report().graphs == () and not s.runtime.capturer.variants["split"].made

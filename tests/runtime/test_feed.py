"""The token feed inside the DECODE program: a fed step (``FED`` ids, ``runtime.tokens.decode``)
gives the tokens of the host-fed step, graph and eager, across joins, leaves and remapped rows,
with pad rows (bs < bucket) and eager fallbacks; unfed steps leave the feed untouched.

Exact equality (no tolerance): both paths run the same program on the same ids; fp32 logits on
the CPU are batch-invariant (see tests/engine/test_overlap.py), so graph and eager agree too.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from graphrt import Batch, ForwardMode, SamplingParams
from graphrt.parallel import TPGroup
from graphrt.runtime.feed import TokenFeed
from graphrt.runtime.feed_kernel import gather_kernel, record_kernel
from graphrt.step import FED
from tests.conftest import DEVICES
from tests.support.triton_util import triton_devices
from tests.support.util import Setup, build_runtime, slot_of

CPU = torch.device("cpu")
ROWS = 6  # request rows (max_reqs); the dummy row is ROWS
#: Request rows of each DECODE step; a row that was not in the step before joins (prefilled
#: anew, a fresh request), so rows leave, come back and change places.
SCHEDULE = [[0, 1, 2], [2, 0, 1], [1, 2], [3, 1, 2, 5], [5], [0, 5]]
PARAMS = {r: SamplingParams(temperature=0.8, top_p=0.9, seed=10 + r) if r % 2 else None for r in range(ROWS)}
PROMPT_LEN = {r: 2 + r for r in range(ROWS)}


def setup(
    buckets: tuple[int, ...] = (1, 2, 4), tp: TPGroup | None = None, device: torch.device = CPU
) -> Setup:
    return build_runtime(
        device, max_batch_size=4, max_reqs=ROWS, max_context_len=64, buckets=buckets, sample=True, tp=tp
    )


def params(rows: list[int]) -> tuple[SamplingParams, ...]:
    return tuple(PARAMS[r] or SamplingParams() for r in rows)


def prefill(s: Setup, rows: list[int], fed: bool, lengths: dict[int, int]) -> list[int]:
    """A fresh request in each row (its KV freed first): one EXTEND, its tokens recorded when fed."""
    for r in rows:
        s.req_to_token.free(r)
        lengths[r] = PROMPT_LEN[r]
    rng = np.random.default_rng(rows)
    lens = [PROMPT_LEN[r] for r in rows]
    batch = Batch.create(
        ForwardMode.EXTEND,
        input_ids=rng.integers(0, s.model.vocab_size, sum(lens)),
        seq_lens=lens,
        req_pool_indices=rows,
        out_cache_loc=[slot_of(s, r, p) for r, n in zip(rows, lens, strict=True) for p in range(n)],
        q_lens=lens,
        sampling=params(rows),
    )
    feed = s.runtime.tokens.prefill if fed else None
    return s.runtime.run(batch, feed=feed).tolist()


def trajectory(
    s: Setup, fed: bool, eager: Callable[[int], bool] = lambda i: False, give_feed: bool = True
) -> list[list[int]]:
    """Every step's tokens over :data:`SCHEDULE`: ids from the feed (``fed``) or from the host.

    ``give_feed`` off: pass no feed to ``run()`` (a TP follower: it uses its runtime's own).
    """
    last: dict[int, int] = {}
    lengths: dict[int, int] = {}
    out: list[list[int]] = []
    before: list[int] = []
    for i, rows in enumerate(SCHEDULE):
        joining = [r for r in rows if r not in before]
        if joining:
            last |= dict(zip(joining, prefill(s, joining, fed and give_feed, lengths), strict=True))
        seq = [lengths[r] + 1 for r in rows]
        batch = Batch.create(
            ForwardMode.DECODE,
            input_ids=[FED] * len(rows) if fed else [last[r] for r in rows],
            seq_lens=seq,
            req_pool_indices=rows,
            out_cache_loc=[slot_of(s, r, n - 1) for r, n in zip(rows, seq, strict=True)],
            sampling=params(rows),
        )
        feed = s.runtime.tokens.decode if fed and give_feed else None
        tokens = s.runtime.run(batch, eager=eager(i), feed=feed).tolist()
        last |= dict(zip(rows, tokens, strict=True))
        lengths |= {r: n for r, n in zip(rows, seq, strict=True)}
        out.append(tokens)
        before = rows
    if fed:  # NOTE: the feed holds each row's last token, as the host saw them
        held = s.runtime.tokens.last.tolist()
        assert {r: held[r] for r in last} == last
    return out


@pytest.fixture(scope="module")
def shared() -> Setup:
    """One runtime for the trajectories: each one prefills its rows anew."""
    return setup()


@pytest.fixture(scope="module")
def reference(shared: Setup) -> list[list[int]]:
    """Host-fed tokens with graphs: what every other path must give."""
    out = trajectory(shared, fed=False)
    # NOTE: the dummy entry (index ROWS) is the torch record's scratch, read by no row
    assert not shared.runtime.tokens.last[:ROWS].any(), "an unfed step wrote the feed"
    return out


@pytest.mark.parametrize("eager", [False, True], ids=["graphs", "alternating-eager"])
def test_fed_tokens_equal_host_fed(shared: Setup, reference: list[list[int]], eager: bool) -> None:
    before = shared.runtime.stats()
    assert trajectory(shared, fed=True, eager=lambda i: eager and i % 2 == 1) == reference
    after = shared.runtime.stats()
    eagers = after.eager.get("DECODE", 0) - before.eager.get("DECODE", 0)
    assert after.replays["DECODE"] - before.replays["DECODE"] == len(SCHEDULE) - eagers
    assert eagers == (len(SCHEDULE) // 2 if eager else 0)


def test_fed_tokens_equal_host_fed_with_eager_fallback(reference: list[list[int]]) -> None:
    s = setup()
    s.runtime.recapture([1, 2])  # NOTE: bs 3 and 4 now fall back to eager (counted)
    assert trajectory(s, fed=True) == reference
    stats = s.runtime.stats()
    assert stats.eager["DECODE"] == 3 and stats.replays["DECODE"] == 3  # bs 3, 3, 4 eager
    assert trajectory(s, fed=False) == reference  # NOTE: host-fed, eager fallback too


@pytest.mark.parametrize("device", [DEVICES[1]])
def test_fed_tokens_equal_host_fed_on_cuda(device: str) -> None:
    """CUDA graphs (bf16, the feed's Triton kernels): graphs only, so both runs replay the same
    buckets (identical GEMM shapes); pad rows in bs 3."""
    s = setup(device=torch.device(device))
    host = trajectory(s, fed=False)
    assert not s.runtime.tokens.last[:ROWS].any(), "an unfed step wrote the feed"
    assert trajectory(s, fed=True) == host
    assert s.runtime.stats().replays["DECODE"] == 2 * len(SCHEDULE)


def test_pad_rows_keep_their_id_and_record_nothing() -> None:
    s = setup()
    lengths: dict[int, int] = {}
    first = prefill(s, [4, 1, 3], True, lengths)
    last = s.runtime.tokens.last
    held = last.clone()
    assert last[[4, 1, 3]].tolist() == first
    seq = [lengths[r] + 1 for r in (4, 1, 3)]
    batch = Batch.create(
        ForwardMode.DECODE,
        input_ids=[FED] * 3,
        seq_lens=seq,
        req_pool_indices=[4, 1, 3],
        out_cache_loc=[slot_of(s, r, n - 1) for r, n in zip((4, 1, 3), seq, strict=True)],
        sampling=params([4, 1, 3]),
    )
    tokens = s.runtime.run(batch, feed=s.runtime.tokens.decode).tolist()
    step = s.runtime.buffers.view(4, 1)  # NOTE: bucket 4 holds one pad row
    assert step.input_ids.tolist() == [FED, FED, FED, 0]  # the host-written flags, pad id 0
    assert step.req_pool_indices.tolist() == [4, 1, 3, ROWS]
    assert last[[4, 1, 3]].tolist() == tokens
    untouched = [0, 2, 5]  # NOTE: rows outside the step; the dummy entry is the record's scratch
    assert torch.equal(last[untouched], held[untouched])


def test_capture_leaves_the_feed_zero() -> None:
    assert not setup().runtime.tokens.last[:ROWS].any()


def test_fed_steps_refused_with_nothing_written() -> None:
    s = setup()
    lengths: dict[int, int] = {}
    prefill(s, [0, 1], True, lengths)
    last, valid = s.runtime.tokens.last.clone(), s.req_to_token.valid_lens.copy()

    def batch(ids: list[int], mode: ForwardMode = ForwardMode.DECODE) -> Batch:
        seq = [lengths[r] + 1 for r in (0, 1)]
        return Batch.create(
            mode,
            input_ids=ids,
            seq_lens=seq,
            req_pool_indices=[0, 1],
            out_cache_loc=[slot_of(s, r, n - 1) for r, n in zip((0, 1), seq, strict=True)],
            q_lens=[1, 1],
            sampling=params([0, 1]),
        )

    feed = s.runtime.tokens.decode
    with pytest.raises(ValueError, match=r"token id -1 .*input_ids\[0\]|input_ids.*-1"):
        s.runtime.run(batch([FED, FED]))  # NOTE: FED ids need a gathering feed
    with pytest.raises(ValueError, match=r"must all be FED \(-1\), got 7 at input_ids\[1\]"):
        s.runtime.run(batch([FED, 7]), feed=feed)
    with pytest.raises(ValueError, match=r"not this runtime's"):
        s.runtime.run(batch([FED, FED]), feed=TokenFeed(ROWS + 1, ROWS, CPU).decode)
    with pytest.raises(ValueError, match=r"needs DECODE or TARGET_VERIFY, got EXTEND"):
        s.runtime.run(batch([FED, FED], ForwardMode.EXTEND), feed=feed)
    assert torch.equal(s.runtime.tokens.last, last)
    assert np.array_equal(s.req_to_token.valid_lens, valid)


@pytest.mark.parametrize("device", triton_devices())
def test_feed_kernels_match_torch_ops(device: torch.device) -> None:
    """The Triton gather and record against the torch ops (their oracle), pad rows included."""
    gen = torch.Generator().manual_seed(0)
    for n in (1, 3, 300):  # NOTE: 300 rows: two programs
        rows = torch.randperm(ROWS * 100, generator=gen)[:n].to(device)
        ids = torch.where(torch.rand(n, generator=gen) < 0.6, FED, 5).to(device)
        ids[-1], rows[-1] = 0, ROWS * 100  # a pad row: pad id, the dummy row
        sampled = torch.randint(0, 1000, (n,), generator=gen).to(device)
        feed = TokenFeed(ROWS * 100 + 1, ROWS * 100, device)
        feed.last.copy_(torch.randint(0, 1000, (ROWS * 100 + 1,), generator=gen))
        want_ids = torch.where(ids < 0, feed.last[rows], ids)
        want_last = feed.last.clone()
        want_last[rows[ids < 0]] = sampled[ids < 0]
        assert torch.equal(gather_kernel(feed.last, ids, rows), want_ids)
        record_kernel(feed.last, ids, rows, sampled)
        assert torch.equal(feed.last, want_last)

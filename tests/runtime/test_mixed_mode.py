"""MIXED parity: decode rows and prompt chunks in one token-bucketed graph against eager.

A mixed step's bucket counts query tokens: a bucket of ``T`` tokens holds up to
``min(T, max_batch_size)`` requests. The cases cover a full bucket, pad requests (no query
token), pad tokens past the last real one (also when every request row is real) and
prefill-only steps; each runs eagerly first, then from its graph, and the graph must write
no KV slot but the step's own and the dummy page's.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from graphrt import Batch, ForwardMode, PoisonLeft, RuntimeConfig, SamplingParams
from graphrt.attention import REQUEST_MODES, registry
from tests.runtime.test_decode_parity import tolerance
from tests.support.util import Setup, backends, build_runtime, refill, slot_of

MAX_BS, MAX_REQS, CONTEXT = 4, 8, 64
TOKEN_BUCKETS = (4, 8, 16)
#: (prefilled lengths of the decode rows, (prefilled, chunk) of the prompt rows) per step.
CASES = [
    ([9, 30], [(0, 6)]),  # 8 tokens: the 8-bucket full, one pad request
    ([17], [(5, 2)]),  # 3 tokens in the 4-bucket: a pad token, two pad requests
    ([3, 12, 40], [(16, 3)]),  # 6 tokens in the 8-bucket: every row real, two pad tokens
    ([], [(0, 16)]),  # prefill-only, the 16-bucket full
    ([], [(7, 5), (0, 4)]),  # prefill-only, 9 tokens in the 16-bucket
    ([63], []),  # one decode row at the end of the context
    ([1, 2], [(1, 1), (33, 11)]),  # 14 tokens, one-token chunk
]


def mixed_batch(setup: Setup, rows: list[int], decode: list[int], chunks: list[tuple[int, int]]) -> Batch:
    """Rows ``rows`` hold ``decode`` then ``chunks``' prefilled lengths already (refilled);
    decode rows write one token, chunk rows ``q`` tokens after their ``p``."""
    rng = np.random.default_rng(len(rows) * 31 + sum(decode))
    seq = [n + 1 for n in decode] + [p + q for p, q in chunks]
    q_lens = [1] * len(decode) + [q for _, q in chunks]
    return Batch.create(
        ForwardMode.MIXED,
        input_ids=rng.integers(0, setup.model.vocab_size, sum(q_lens)),
        seq_lens=seq,
        req_pool_indices=rows,
        out_cache_loc=[
            slot_of(setup, r, p) for r, n, q in zip(rows, seq, q_lens, strict=True) for p in range(n - q, n)
        ],
        q_lens=q_lens,
    )


def fill(setup: Setup, rows: list[int], lens: list[int]) -> None:
    """Row ``rows[i]`` holds exactly ``lens[i]`` positions of KV (0: prefilled, then dropped by
    the chunk that rewrites it from position 0)."""
    for r, n in zip(rows, lens, strict=True):
        refill(setup, [r], max(n, 1))


def outside(setup: Setup, batch: Batch) -> torch.Tensor:
    """Every KV slot a graph of ``batch`` may not write: all but its own and the dummy page's."""
    keep = torch.ones(
        setup.kv.num_live_slots + setup.kv.page_size, dtype=torch.bool, device=setup.kv.k[0].device
    )
    keep[torch.as_tensor(batch.out_cache_loc, device=keep.device)] = False
    keep[setup.kv.dummy_slot : setup.kv.dummy_slot + setup.kv.page_size] = False
    return keep[: setup.kv.k[0].view(-1, *setup.kv.k[0].shape[2:]).shape[0]]


@pytest.mark.parametrize("page_size", [4])
def test_mixed_graph_matches_eager(device: torch.device, page_size: int) -> None:
    tol = tolerance(device)
    for backend in backends(device):
        setup = build_runtime(
            device,
            backend=backend,
            page_size=page_size,
            max_batch_size=MAX_BS,
            max_context_len=CONTEXT,
            max_reqs=MAX_REQS,
            modes=(ForwardMode.MIXED,),
            token_buckets=TOKEN_BUCKETS,
        )
        rt, rng = setup.runtime, np.random.default_rng(page_size)
        assert {b for _, b in rt.dispatcher.graphs} == set(TOKEN_BUCKETS)
        for decode, chunks in CASES:
            rows = [int(r) for r in rng.choice(MAX_REQS, len(decode) + len(chunks), replace=False)]
            fill(setup, rows, decode + [p for p, _ in chunks])
            batch = mixed_batch(setup, rows, decode, chunks)
            bucket = next(b for b in TOKEN_BUCKETS if b >= batch.num_tokens)
            graph = rt.dispatcher.graphs[(ForwardMode.MIXED, bucket)]
            assert graph.info.host_scalars["max_seqlen_q"] == bucket  # NOTE: a function of the key
            out_eager = rt.run(batch, eager=True)
            k_before = setup.kv.k[0].flatten(0, 1).clone()
            replays = graph.info.replays
            out_graph = rt.run(batch)
            assert graph.info.replays == replays + 1
            changed = (setup.kv.k[0].flatten(0, 1) != k_before).flatten(1).any(1)
            assert not (changed & outside(setup, batch)).any(), "a pad row wrote a live KV slot"
            where = f"{backend} page_size={page_size} decode={decode} chunks={chunks}"
            assert out_graph.shape == out_eager.shape == (batch.num_tokens, setup.model.vocab_size)
            torch.testing.assert_close(out_graph, out_eager, **tol, msg=lambda m, w=where: f"{w}: {m}")
        stats = rt.stats()
        assert stats.replays == {"MIXED": len(CASES)} and stats.fallbacks == {}


def test_a_sampling_step_computes_the_head_on_each_requests_last_row_only(device: torch.device) -> None:
    """A sampling runtime's MIXED step runs its head on one row per request (``head_rows``), not
    on a prompt's every token: unsampled, it returns those rows' logits ``[bs, V]`` (the full
    logits' last rows, from a runtime that does not sample); sampled, their greedy picks, eager
    and graphed alike."""
    kw = dict(max_batch_size=MAX_BS, max_context_len=CONTEXT, max_reqs=MAX_REQS, modes=(ForwardMode.MIXED,))
    full, setup = (build_runtime(device, token_buckets=TOKEN_BUCKETS, sample=s, **kw) for s in (False, True))
    rows, (decode, chunks) = [2, 5, 6], ([9, 30], [(0, 6)])
    for s in (full, setup):
        fill(s, rows, decode + [p for p, _ in chunks])
    batch = mixed_batch(setup, rows, decode, chunks)
    want = full.runtime.run(batch, eager=True)[torch.as_tensor(np.cumsum(batch.q_lens) - 1, device=device)]
    seen: list[int] = []
    norm = setup.model.norm  # NOTE: the final norm runs in the head's prologue (norm.linear)
    head = norm.linear
    norm.linear = lambda x, *a: (seen.append(x.shape[0]), head(x, *a))[1]
    try:
        last = setup.runtime.run(batch, eager=True)
    finally:
        del norm.linear
    assert (
        seen == [len(rows)]
        and batch.num_tokens == 8
        and last.shape == want.shape == (3, setup.model.vocab_size)
    )
    torch.testing.assert_close(last, want, **tolerance(device))
    torch.testing.assert_close(setup.runtime.run(batch), want, **tolerance(device))
    sampled = dataclasses.replace(batch, sampling=(SamplingParams(temperature=0.0),) * len(rows))
    greedy = want.argmax(-1)
    assert torch.equal(setup.runtime.run(sampled, eager=True), greedy) and torch.equal(
        setup.runtime.run(sampled), greedy
    )


@pytest.mark.slow
def test_debug_poison_leaves_nothing_in_mixed_buckets(device: torch.device) -> None:
    """Debug mode poisons every buffer before each update: mixed steps that shrink inside and
    across token buckets leave none of it behind, and match eager."""
    setup = build_runtime(
        device,
        max_batch_size=MAX_BS,
        max_context_len=CONTEXT,
        max_reqs=MAX_REQS,
        modes=(ForwardMode.MIXED,),
        token_buckets=TOKEN_BUCKETS,
        debug=True,
    )
    for decode, chunks in sorted(CASES, key=lambda c: -sum(q for _, q in c[1]) - len(c[0])):
        rows = list(range(len(decode) + len(chunks)))
        fill(setup, rows, decode + [p for p, _ in chunks])
        batch = mixed_batch(setup, rows, decode, chunks)
        out_eager = setup.runtime.run(batch, eager=True)
        try:
            out_graph = setup.runtime.run(batch)
        except PoisonLeft as exc:
            pytest.fail(f"decode={decode} chunks={chunks}: {exc}")
        torch.testing.assert_close(out_graph, out_eager, **tolerance(device))
    assert setup.runtime.stats().replays == {"MIXED": len(CASES)}


def test_steps_no_graph_holds_run_eagerly_and_are_counted() -> None:
    """Past the largest token bucket, or more requests than a bucket's rows: eager, counted
    with the reason; ``strict`` raises it instead."""
    setup = build_runtime(
        torch.device("cpu"),
        max_batch_size=MAX_BS,
        max_context_len=CONTEXT,
        max_reqs=MAX_REQS,
        modes=(ForwardMode.MIXED,),
        token_buckets=(4, 8),
    )
    rows = list(range(5))
    fill(setup, rows, [3, 4, 5, 6, 7])
    many = mixed_batch(setup, rows, [3, 4, 5, 6, 7], [])  # 5 requests in the 8-token graph of 4
    long = mixed_batch(setup, [6], [], [(0, 9)])
    setup.runtime.run(many)
    setup.runtime.run(long)
    assert setup.runtime.stats().fallbacks == {
        "MIXED": {"bs 5 > the 4 requests a 5-token graph holds": 1, "tokens 9 > largest bucket 8": 1}
    }
    assert setup.runtime.stats().eager == {"EXTEND": 5, "MIXED": 2}


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({}, r"capture_modes holds MIXED but token_buckets is empty"),
        ({"token_buckets": (8, 4)}, r"token_buckets must be sorted and unique, got \(8, 4\)"),
        ({"token_buckets": (0, 4)}, r"token_buckets must be positive ints, got \(0, 4\)"),
    ],
)
def test_bad_mixed_configs_are_refused(kw: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RuntimeConfig(capture_modes=(ForwardMode.MIXED,), **kw)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "window_pool", "kv"),
    [
        ("tiny-qwen3-moe", False, None),
        ("tiny-llama-swa", True, None),
        ("tiny-mla", False, None),
        ("tiny-sinks", False, None),
        ("tiny-llama", False, "fp8_e4m3"),
        ("tiny-llama-local", False, None),
    ],
    ids=["moe", "window-pool", "dense-mla", "sinks", "fp8-kv", "chunked-local"],
)
def test_mixed_graphs_serve_the_features(
    device: torch.device, model: str, window_pool: bool, kv: str | None
) -> None:
    """MoE routing buffers hold the largest token bucket (pad tokens route to no expert); a
    window pool holds a whole bucket's chunk; dense MLA, sinks and an FP8 cache attend varlen
    queries alike (on a Hopper GPU through FA3's rows). Debug poison on, graph = eager."""
    setup = build_runtime(
        device,
        backend=None,
        kv_cache_dtype=kv,
        model=model,
        max_batch_size=MAX_BS,
        max_context_len=CONTEXT,
        max_reqs=MAX_REQS,
        modes=(ForwardMode.MIXED,),
        token_buckets=(4, 16),
        window_pool=window_pool,
        debug=True,
    )
    routing = setup.runtime.groups.group("routing")
    assert (routing is not None) == (model == "tiny-qwen3-moe")
    if routing is not None:
        assert routing.view(MAX_BS, 1, 16).topk_ids.shape[0] == 16 == routing.dims.max_tokens
    for decode, chunks in (CASES[3], CASES[2], CASES[1]):
        rows = list(range(len(decode) + len(chunks)))
        fill(setup, rows, decode + [p for p, _ in chunks])
        batch = mixed_batch(setup, rows, decode, chunks)
        out_eager = setup.runtime.run(batch, eager=True)
        torch.testing.assert_close(setup.runtime.run(batch), out_eager, **tolerance(device))
    assert setup.runtime.stats().replays == {"MIXED": 3}


def test_a_backend_without_mixed_is_refused_or_routed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The toy backend declares no MIXED: named, it is refused naming both; preferred but
    unnamed, a MIXED runtime is routed to the reference."""
    monkeypatch.setattr(registry, "BACKENDS", {k: dict(v) for k, v in registry.BACKENDS.items()})
    registry.add_backend("mha", "toy", "tests.support.toy_backend:ToyBackend", first=True)
    kw = {"modes": (ForwardMode.DECODE, ForwardMode.MIXED), "token_buckets": (2,), "max_batch_size": 1}
    with pytest.raises(ValueError, match=r"backend 'toy' cannot be captured for MIXED \(it supports DECODE"):
        build_runtime(torch.device("cpu"), backend="toy", **kw)
    assert build_runtime(torch.device("cpu"), backend=None, **kw).runtime.backend.name == "reference"
    assert build_runtime(torch.device("cpu"), backend=None, capture=False).runtime.backend.name == "toy"
    assert ForwardMode.MIXED not in REQUEST_MODES
    with pytest.raises(ValueError, match=r"backend 'reference' cannot be captured for MIXED"):
        build_runtime(torch.device("cpu"), model="tiny-dsa", backend=None, **kw)  # NOTE: sparse MLA

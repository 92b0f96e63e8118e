"""GraphRuntime behaviour: stable buffer addresses, pad rows, fallbacks, host scalars, capture."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from graphrt import (
    Batch,
    ForwardMode,
    GraphFallbackError,
    GraphRuntime,
    HostScalarMismatch,
)
from graphrt.metadata import StepBuffers
from tests.support.util import Setup, build_runtime, decode_batch, next_lens, prefill, slot_of

DECODE = ForwardMode.DECODE
BUCKETS = (1, 2, 4, 8)
FIELDS = tuple(f.name for f in dataclasses.fields(StepBuffers))
CONTEXT = 64


def snapshot(setup: Setup) -> dict[str, torch.Tensor]:
    """Copies of everything a step may write: KV, req_to_token, both buffer arenas."""
    state = {"req_to_token": setup.req_to_token.table.clone()}
    for layer, (k, v) in enumerate(zip(setup.kv.k, setup.kv.v, strict=True)):
        state[f"k{layer}"], state[f"v{layer}"] = k.clone(), v.clone()
    state["arena"] = setup.runtime.buffers.arena.clone()
    state["host_arena"] = setup.runtime.buffers.host_arena.clone()
    return state


def assert_unchanged(setup: Setup, before: dict[str, torch.Tensor], skip: tuple[str, ...] = ()) -> None:
    after = snapshot(setup)
    changed = [name for name in before if name not in skip and not torch.equal(before[name], after[name])]
    assert changed == [], f"modified: {changed}"


def uncaptured(device: torch.device, record_kernels: bool = False, **kwargs: object) -> Setup:
    """A runtime configured to capture DECODE that has not captured yet."""
    setup = build_runtime(device, capture=False, **kwargs)  # type: ignore[arg-type]
    config = dataclasses.replace(setup.runtime.config, capture_modes=(DECODE,), record_kernels=record_kernels)
    runtime = GraphRuntime(
        setup.model, setup.kv, setup.req_to_token, config, vocab_size=setup.model.vocab_size
    )
    return dataclasses.replace(setup, runtime=runtime)


def prefill_rows(setup: Setup, rows: list[int], rng: np.random.Generator) -> list[int]:
    """Prefill ``rows`` with distinct lengths; returns the lengths."""
    lens = [int(n) for n in rng.integers(2, CONTEXT // 2, len(rows))]
    prefill(setup, rows, lens, rng)
    return lens


def test_bucket_views_keep_addresses(device: torch.device) -> None:
    setup = build_runtime(device, max_context_len=CONTEXT)
    buffers = setup.runtime.buffers
    rng = np.random.default_rng(0)
    prefill_rows(setup, list(range(8)), rng)
    views = {b: buffers.view(b) for b in BUCKETS}
    ptrs = {(b, f): getattr(views[b], f).data_ptr() for b in BUCKETS for f in FIELDS}
    arena_ptr = buffers.arena.data_ptr()
    for bs in (8, 3, 5, 1, 2, 8, 6):
        reqs = [int(r) for r in rng.choice(8, bs, replace=False)]
        setup.runtime.run(decode_batch(setup, reqs, next_lens(setup, reqs), rng))
    assert setup.runtime.stats().replays == {"DECODE": 7}
    assert buffers.arena.data_ptr() == arena_ptr
    for b in BUCKETS:
        assert buffers.view(b) is views[b], f"bucket {b} view was rebuilt"
        for f in FIELDS:
            t = getattr(buffers.view(b), f)
            assert t.data_ptr() == ptrs[(b, f)], f"bucket {b} {f} moved"
            # every view is a slice of the one arena, starting where the full buffer starts
            assert t.data_ptr() == buffers.full[f].data_ptr()
            assert t.untyped_storage().data_ptr() == buffers.arena.untyped_storage().data_ptr()
            assert t.shape[0] == (b + 1 if f == "cu_seqlens_q" else b)


@pytest.mark.parametrize("page_size", [1, 16])
def test_pad_rows_after_shrink_in_bucket(device: torch.device, page_size: int) -> None:
    # NOTE: one bucket of 8, so the 3-request batch shrinks inside it (the ladder would pick 4)
    setup = build_runtime(device, page_size=page_size, max_context_len=CONTEXT, buckets=(8,))
    runtime = setup.runtime
    rng = np.random.default_rng(1)
    lens = prefill_rows(setup, list(range(8)), rng)
    runtime.run(decode_batch(setup, list(range(8)), [n + 1 for n in lens], rng))
    reqs = [6, 1, 4]
    seq_lens = [lens[r] + 2 for r in reqs]  # the 8-request step wrote position lens[r]
    batch = decode_batch(setup, reqs, seq_lens, rng)
    runtime.run(batch)
    assert runtime.dispatcher.graphs[(DECODE, 8)].info.replays == 2

    pad = runtime.pad_values(DECODE)
    assert pad == {
        "dummy_slot": setup.kv.dummy_slot,
        "dummy_page": setup.kv.dummy_page,
        "dummy_req": 8,
        "pad_q_len": 1,
        "pad_seq_len": 1,
        "pad_prefix_len": 1,
    }
    v = runtime.buffers.view(8)
    # real rows
    assert v.input_ids[:3].tolist() == batch.input_ids.tolist()
    assert v.positions[:3].tolist() == [n - 1 for n in seq_lens]
    assert v.cache_seqlens[:3].tolist() == seq_lens
    assert v.req_pool_indices[:3].tolist() == reqs
    assert v.out_cache_loc[:3].tolist() == [
        slot_of(setup, r, n - 1) for r, n in zip(reqs, seq_lens, strict=True)
    ]
    for i, (r, n) in enumerate(zip(reqs, seq_lens, strict=True)):
        pages = -(-n // page_size)
        expected = [slot_of(setup, r, p * page_size) // page_size for p in range(pages)]
        assert v.page_table[i, :pages].tolist() == expected, f"row {i}"
    # pad rows 3..7: exact dummy values, whatever the 8-request batch left there
    assert v.input_ids[3:].tolist() == [0] * 5
    assert v.positions[3:].tolist() == [0] * 5
    assert v.cache_seqlens[3:].tolist() == [1] * 5
    assert v.req_pool_indices[3:].tolist() == [pad["dummy_req"]] * 5
    assert v.out_cache_loc[3:].tolist() == [pad["dummy_slot"]] * 5
    assert (v.page_table[3:] == pad["dummy_page"]).all()
    assert v.cu_seqlens_q.tolist() == list(range(9))
    assert runtime.buffers.pad_violations(8, 1, 3, runtime.pad_values(DECODE)) == []


def test_pad_violations_detects_stale_rows(device: torch.device) -> None:
    """The checker used above must see a stale pad row (else the assertion could not fail)."""
    setup = build_runtime(device, max_context_len=CONTEXT)
    rng = np.random.default_rng(2)
    lens = prefill_rows(setup, list(range(8)), rng)
    setup.runtime.run(decode_batch(setup, list(range(8)), [n + 1 for n in lens], rng))
    pad = setup.runtime.pad_values(DECODE)
    assert setup.runtime.buffers.pad_violations(8, 1, 8, pad) == []
    # rows 3..7 still hold the 8-request batch: as if an updater had skipped the pad rows
    assert set(setup.runtime.buffers.pad_violations(8, 1, 3, pad)) >= {
        "cache_seqlens",
        "req_pool_indices",
        "out_cache_loc",
        "page_table",
    }


def test_fallback_when_batch_exceeds_largest_bucket(device: torch.device) -> None:
    setup = build_runtime(device, max_context_len=CONTEXT, max_reqs=12)
    rng = np.random.default_rng(3)
    lens = prefill_rows(setup, list(range(12)), rng)
    reqs = list(range(10))
    batch = decode_batch(setup, reqs, [lens[r] + 1 for r in reqs], rng)
    out = setup.runtime.run(batch)
    assert out.shape == (10, setup.model.vocab_size)
    torch.testing.assert_close(out, setup.runtime.run(batch, eager=True), atol=0, rtol=0)
    small = decode_batch(setup, [0, 1, 2], [lens[r] + 1 for r in (0, 1, 2)], rng)
    setup.runtime.run(small)
    stats = setup.runtime.stats()
    assert stats.fallbacks == {"DECODE": {"bs 10 > largest bucket 8": 1}}
    assert stats.eager == {"EXTEND": 1, "DECODE": 2}  # the fallback and the forced eager run
    assert stats.replays == {"DECODE": 1}


def test_fallback_when_mode_not_captured(device: torch.device) -> None:
    setup = build_runtime(device, max_context_len=CONTEXT, capture=False)
    rng = np.random.default_rng(4)
    lens = prefill_rows(setup, [0, 1, 2], rng)
    for step in range(2):
        setup.runtime.run(decode_batch(setup, [0, 1, 2], [n + 1 + step for n in lens], rng))
    stats = setup.runtime.stats()
    assert stats.fallbacks == {"DECODE": {"mode DECODE not captured": 2}}
    assert stats.replays == {}
    assert stats.eager == {"EXTEND": 1, "DECODE": 2}


@pytest.mark.parametrize(
    ("capture", "bs", "reason"),
    [(True, 10, "bs 10 > largest bucket 8"), (False, 3, "mode DECODE not captured")],
)
def test_strict_raises_instead_of_falling_back(
    device: torch.device, capture: bool, bs: int, reason: str
) -> None:
    setup = build_runtime(device, max_context_len=CONTEXT, max_reqs=12, capture=capture, strict=True)
    rng = np.random.default_rng(5)
    lens = prefill_rows(setup, list(range(12)), rng)
    batch = decode_batch(setup, list(range(bs)), [lens[r] + 1 for r in range(bs)], rng)
    before = snapshot(setup)
    with pytest.raises(GraphFallbackError, match=reason):
        setup.runtime.run(batch)
    assert_unchanged(setup, before)
    stats = setup.runtime.stats()
    assert stats.fallbacks == {}
    assert stats.eager == {"EXTEND": 1}
    setup.runtime.run(batch, eager=True)  # forced eager is not a fallback: strict allows it


def test_host_scalar_mismatch_raises_before_writing(
    device: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    setup = build_runtime(device, max_context_len=CONTEXT)
    rng = np.random.default_rng(6)
    lens = prefill_rows(setup, list(range(4)), rng)
    graph = setup.runtime.dispatcher.graphs[(DECODE, 4)]
    assert graph.info.host_scalars["max_seqlen_q"] == 1
    monkeypatch.setitem(graph.info.host_scalars, "max_seqlen_q", 0)
    batch = decode_batch(setup, [0, 1, 2], [lens[r] + 1 for r in range(3)], rng)
    before = snapshot(setup)
    with pytest.raises(HostScalarMismatch, match=r"max_seqlen_q: batch needs 1, graph was captured with 0"):
        setup.runtime.run(batch)
    assert_unchanged(setup, before)
    assert graph.info.replays == 0
    assert setup.runtime.stats().replays == {}
    # other buckets keep their own frozen scalars and still replay
    setup.runtime.run(decode_batch(setup, [3], [lens[3] + 1], rng))
    assert setup.runtime.stats().replays == {"DECODE": 1}


@pytest.mark.parametrize("page_size", [1, 16])
def test_capture_report(device: torch.device, page_size: int) -> None:
    setup = uncaptured(device, record_kernels=True, page_size=page_size, max_context_len=CONTEXT)
    report = setup.runtime.capture()
    assert report.engine == ("cuda" if device.type == "cuda" else "emulated")
    assert report.backend == setup.runtime.backend.name
    assert [g.key for g in report.graphs] == [(DECODE, b) for b in (8, 4, 2, 1)]  # largest first
    for g in report.graphs:
        assert g.host_scalars["max_seqlen_q"] == 1
        assert g.host_scalars["page_size"] == page_size
        assert g.num_nodes > 0
    max_bs, max_tokens, max_pages = 8, 8, -(-CONTEXT // page_size)
    declared = {  # name -> elements x bytes per element, from the STEP_SPECS table
        "input_ids": max_tokens * 8,
        "positions": max_tokens * 8,
        "out_cache_loc": max_tokens * 8,
        "req_id_per_token": max_tokens * 8,
        "req_pool_indices": max_bs * 8,
        "cache_seqlens": max_bs * 4,
        "cu_seqlens_q": (max_bs + 1) * 4,
        "page_bound": max_bs * 4,
        "page_table": max_bs * max_pages * 4,
    }
    mem = report.buffers
    assert {r.name: r.nbytes for r in mem.rows} == declared
    assert mem.total_bytes == sum(declared.values())
    assert mem.arena_bytes == setup.runtime.buffers.arena.numel() >= mem.total_bytes
    assert mem.padding_bytes == mem.arena_bytes - sum(declared.values())
    host_bytes = sum(v for k, v in declared.items() if k != "page_table")
    assert mem.host_arena_bytes == setup.runtime.buffers.host_arena.numel() >= host_bytes


@pytest.mark.parametrize("page_size", [1, 16])
def test_capture_touches_only_the_dummy_slot(device: torch.device, page_size: int) -> None:
    setup = uncaptured(device, page_size=page_size, max_context_len=CONTEXT)
    gen = torch.Generator().manual_seed(0)
    for cache in (*setup.kv.k, *setup.kv.v):
        cache.copy_(torch.randn(cache.shape, generator=gen))
    rng = np.random.default_rng(7)
    prefill_rows(setup, [0, 3, 7], rng)
    before = snapshot(setup)
    setup.runtime.capture()
    dummy = setup.kv.dummy_slot
    keep = torch.ones(setup.kv.shape.num_pages * page_size, dtype=torch.bool, device=device)
    keep[dummy] = False
    kvh, d = setup.kv.shape.num_kv_heads, setup.kv.shape.head_dim
    for layer in range(setup.kv.shape.num_layers):
        for name, cache in (("k", setup.kv.k[layer]), ("v", setup.kv.v[layer])):
            old, new = before[f"{name}{layer}"].view(-1, kvh, d), cache.view(-1, kvh, d)
            assert torch.equal(old[keep], new[keep]), f"capture wrote a live {name} slot in layer {layer}"
            assert not torch.equal(old[dummy], new[dummy]), "capture should write the dummy slot"
    assert torch.equal(before["req_to_token"], setup.req_to_token.table)


def test_batch_positions_are_last_q_len_positions() -> None:
    batch = Batch.create(
        ForwardMode.EXTEND,
        input_ids=np.arange(6),
        seq_lens=[3, 5, 1],
        req_pool_indices=[0, 1, 2],
        out_cache_loc=np.arange(6),
        q_lens=[2, 3, 1],
    )
    assert batch.positions.tolist() == [1, 2, 2, 3, 4, 0]


def test_graph_output_is_a_fresh_tensor(device: torch.device) -> None:
    """The static output is overwritten by the next replay; ``run`` must hand back a copy."""
    setup = build_runtime(device, max_context_len=CONTEXT)
    rng = np.random.default_rng(8)
    lens = prefill_rows(setup, [0, 1, 2, 3], rng)
    first = setup.runtime.run(decode_batch(setup, [0, 1, 2], [lens[r] + 1 for r in range(3)], rng))
    kept = first.clone()
    second = setup.runtime.run(decode_batch(setup, [3, 1, 0], [lens[3] + 1, lens[1] + 2, lens[0] + 2], rng))
    assert first.data_ptr() != second.data_ptr()
    assert torch.equal(first, kept)
    assert not torch.equal(first, second)

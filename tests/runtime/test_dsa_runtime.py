"""DSA through GraphRuntime: graph == eager for DECODE and TARGET_VERIFY, both KV layouts;
a graph captured on short (all-padding) sequences replayed at 4 x index_topk; stale index
rows of padded tokens; stable addresses of every sparse buffer the graph reads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrt import ForwardMode
from graphrt.step.modes import SpecGeometry
from tests.support.util import Setup, build_runtime, decode_batch, prefill, slot_of, spec_batch

DECODE, VERIFY = ForwardMode.DECODE, ForwardMode.TARGET_VERIFY
TOPK = 64
CONTEXT = 4 * TOPK
SPEC = SpecGeometry(num_steps=2)  # TARGET_VERIFY: 3 tokens per request


_CACHE: dict[tuple[str, str], Setup] = {}


def dsa(device: torch.device, layout: str) -> Setup:
    """One captured runtime per (device, layout), shared by this module's tests.

    NOTE: capture dominates the CPU cost; every test prefills the rows it reads, and every
    replay rewrites the whole bucket, so sharing cannot hide a stale-buffer bug.
    """
    key = (device.type, layout)
    if key not in _CACHE:
        _CACHE[key] = _build(device, layout)
    return _CACHE[key]


def _build(device: torch.device, layout: str) -> Setup:
    backend = None if device.type == "cuda" else "reference"
    return build_runtime(
        device,
        model="tiny-dsa",
        kv_cache_dtype=layout,
        backend=backend,  # type: ignore[arg-type]
        max_batch_size=4,
        buckets=(1, 4),
        max_context_len=CONTEXT,
        modes=(DECODE, VERIFY),
        speculative=SPEC,
    )


def tol(device: torch.device) -> dict[str, float]:
    return {"rtol": 2e-2, "atol": 5e-2} if device.type == "cuda" else {"rtol": 1e-4, "atol": 1e-4}


@pytest.mark.parametrize("layout", ["bf16", pytest.param("fp8", marks=pytest.mark.slow)])
def test_graph_matches_eager_decode_and_verify(device: torch.device, layout: str) -> None:
    setup = dsa(device, layout)
    rng = np.random.default_rng(0)
    lens = [20, 90, 5, 150]  # shorter and longer than index_topk
    prefill(setup, [0, 1, 2, 3], lens, rng)
    for reqs in ([2], [0, 3], [0, 1, 2, 3]):
        batch = decode_batch(setup, reqs, [lens[r] + 1 for r in reqs], rng)
        eager = setup.runtime.run(batch, eager=True)
        torch.testing.assert_close(setup.runtime.run(batch), eager, **tol(device))
        batch = spec_batch(setup, VERIFY, reqs, [lens[r] + 3 for r in reqs], [3] * len(reqs), rng)
        eager = setup.runtime.run(batch, eager=True)
        torch.testing.assert_close(setup.runtime.run(batch), eager, **tol(device))
    replays = setup.runtime.stats().replays
    assert replays["DECODE"] >= 3 and replays["TARGET_VERIFY"] >= 3


@pytest.mark.parametrize("layout", ["bf16", "fp8"])
def test_short_capture_long_replay(device: torch.device, layout: str) -> None:
    """Capture saw only pad rows of length <= 3; replay at 4 x index_topk must select fully."""
    setup = dsa(device, layout)
    rng = np.random.default_rng(1)
    lens = [CONTEXT - 3, CONTEXT - 40]
    prefill(setup, [0, 1], lens, rng)
    batch = spec_batch(setup, VERIFY, [0, 1], [n + 3 for n in lens], [3, 3], rng)
    eager = setup.runtime.run(batch, eager=True)
    torch.testing.assert_close(setup.runtime.run(batch), eager, **tol(device))
    view = setup.runtime.groups.groups["attention"].view(4, 3)
    idx = view.topk_indices[:6].cpu()
    assert (idx >= 0).all(), "long sequences must fill all index_topk entries"
    assert int(idx.max()) >= 3 * TOPK, "indices must reach far past index_topk positions"
    batch = decode_batch(setup, [0, 1], [CONTEXT, CONTEXT - 36], rng)
    eager = setup.runtime.run(batch, eager=True)
    torch.testing.assert_close(setup.runtime.run(batch), eager, **tol(device))


def test_short_sequences_give_minus_one_tails(device: torch.device) -> None:
    setup = dsa(device, "bf16")
    rng = np.random.default_rng(2)
    prefill(setup, [0, 1], [9, 30], rng)
    setup.runtime.run(decode_batch(setup, [0, 1], [10, 31], rng))
    view = setup.runtime.groups.groups["attention"].view(4, 1)
    idx, slots = view.topk_indices.cpu(), view.topk_slots.cpu()
    for row, n, req in ((0, 10, 0), (1, 31, 1)):
        assert sorted(idx[row, :n].tolist()) == list(range(n))  # every past key, then −1
        assert (idx[row, n:] == -1).all() and (slots[row, n:] == -1).all()
        want = [slot_of(setup, req, int(p)) for p in idx[row, :n]]
        assert slots[row, :n].tolist() == want


@pytest.mark.parametrize("layout", ["bf16", "fp8"])
def test_padded_rows_with_stale_indices(device: torch.device, layout: str) -> None:
    setup = dsa(device, layout)
    rng = np.random.default_rng(3)
    lens = [120, 70, 40, 100]
    prefill(setup, [0, 1, 2, 3], lens, rng)
    setup.runtime.run(decode_batch(setup, [0, 1, 2, 3], [n + 1 for n in lens], rng))
    view = setup.runtime.groups.groups["attention"].view(4, 1)
    live = slot_of(setup, 3, 5)
    view.topk_indices.fill_(5)  # stale, valid-looking rows everywhere
    view.topk_slots.fill_(live)
    batch = decode_batch(setup, [1, 2], [lens[1] + 2, lens[2] + 2], rng)
    eager = setup.runtime.run(batch, eager=True)
    torch.testing.assert_close(setup.runtime.run(batch), eager, **tol(device))
    pad = view.topk_slots[2:].cpu()
    dummy = setup.kv.dummy_slot
    assert ((pad == dummy) | (pad == -1)).all(), "pad tokens may read only the dummy slot"


def test_sparse_buffers_keep_addresses(device: torch.device) -> None:
    setup = dsa(device, "fp8")
    extra = setup.runtime.groups.groups["attention"]
    rng = np.random.default_rng(4)
    prefill(setup, [0, 1, 2], [30, 81, 132], rng)  # row i first decodes at step i
    keys = [(b, t) for b in (1, 4) for t in (1, 3)]
    names = ("topk_indices", "topk_slots", "q_pad", "sched_meta", "num_splits")
    ptrs = {(k, n): getattr(extra.view(*k), n).data_ptr() for k in keys for n in names}
    arena = extra.arena.data_ptr()
    for step in range(3):
        reqs = [0, 1, 2][: step + 1]
        setup.runtime.run(
            decode_batch(setup, reqs, [30 + step + 1, 80 + step + 1, 130 + step + 1][: step + 1], rng)
        )
    assert extra.arena.data_ptr() == arena
    for k in keys:
        for n in names:
            assert getattr(extra.view(*k), n).data_ptr() == ptrs[(k, n)], f"{k} {n} moved"
    scalars = next(iter(setup.runtime.dispatcher.graphs.values())).info.host_scalars
    assert scalars["max_seqlen_q"] in (1, 3)
    if device.type == "cuda":
        assert scalars["flashmla.padded_heads"] == 64

"""The window-layer KV pool: outputs equal the full-pool layout in every mode it is graphed in.

``tiny-llama-swa`` and ``tiny-sinks`` (window 24, window and full layers alternate) run the same
weights and batches on two stacks: window layers in the full cache, and in the window pool
(``window_pool=True``). On the CPU the reference backend reads the same keys through either
page table (masked keys contribute exactly 0), so replays agree bit for bit; graph and eager
agree within the suite's tolerance. A GPU run compares FA3 on the pool with the reference.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrt.kv.ledger import KVIsolationError
from graphrt.step.modes import ForwardMode, SpecGeometry
from tests.runtime.test_spec_modes import draft_batch, verify_batch
from tests.support.util import Setup, build_runtime, decode_batch, prefill, slot_of, spec_batch

M = ForwardMode
CHAIN = SpecGeometry(num_steps=3)
MODES = (M.DECODE, M.TARGET_VERIFY, M.DRAFT_EXTEND, M.DRAFT_DECODE)
CONTEXT, ROWS, PAGE = 96, 4, 4


def setup(
    device: torch.device,
    model: str,
    pool: bool,
    backend: str = "reference",
    modes: tuple[ForwardMode, ...] = MODES,
    **kw: object,
) -> Setup:
    return build_runtime(
        device,
        backend=backend,
        model=model,
        page_size=PAGE,
        modes=modes,
        capture=bool(modes),
        speculative=CHAIN,
        buckets=(4,),
        max_batch_size=4,
        max_reqs=ROWS,
        max_context_len=CONTEXT,
        window_pool=pool,
        **kw,  # type: ignore[arg-type]
    )


def rounds(s: Setup, lens: list[int], reqs: list[int], rng: np.random.Generator) -> list:
    """One speculative round per call: DECODE, TARGET_VERIFY, DRAFT_EXTEND, DRAFT_DECODE at ``lens``."""
    n, bs = CHAIN.num_draft_tokens, len(reqs)
    accept = [int(a) for a in rng.integers(1, n + 1, bs)]
    return [
        decode_batch(s, reqs, [lens[r] + 1 for r in reqs], rng),
        verify_batch(s, CHAIN, reqs, lens, rng),
        spec_batch(
            s, M.DRAFT_EXTEND, reqs, [lens[r] + a for r, a in zip(reqs, accept, strict=True)], accept, rng
        ),
        draft_batch(s, CHAIN, reqs, lens, rng),
    ]


def agree(got: torch.Tensor, want: torch.Tensor, mode: ForwardMode, device: torch.device, what: str) -> None:
    """CPU: equal (graphs) or within 1e-5 (eager); CUDA (bf16, FA3 or reference): the suite's bounds."""
    if device.type == "cpu" and what != "eager":
        assert torch.equal(got, want), (what, mode)
    elif mode is M.DRAFT_DECODE:  # NOTE: later draft steps feed on earlier argmaxes
        assert (got[:, 0] == want[:, 0]).float().mean() >= (1.0 if device.type == "cpu" else 0.8), (
            what,
            mode,
        )
    elif device.type == "cpu":
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=f"{what} {mode.name}")
    else:
        err = ((got.float() - want.float()).norm() / want.float().norm()).item()
        assert err <= 2e-2, (what, mode, err)


def run_rounds(stacks: list[Setup], device: torch.device, rounds_: int = 5) -> None:
    """Rows grow past the window across rounds; each round's batches run on every stack (the
    first is the oracle), graphed then eagerly."""
    rng = np.random.default_rng(5)
    lens = [int(n) for n in rng.integers(3, 20, ROWS)]
    for s in stacks:
        prefill(s, list(range(ROWS)), lens, np.random.default_rng(1))
    for step in range(rounds_):
        reqs = [int(r) for r in rng.choice(ROWS, 3, replace=False)]
        seed = int(rng.integers(1 << 30))
        outs = [
            [s.runtime.run(b) for b in rounds(s, lens, reqs, np.random.default_rng(seed))] for s in stacks
        ]
        # NOTE: eager on every stack, so their KV stays the same (eager writes differ from a
        # graph's in the last bits).
        eager = [
            [s.runtime.run(b, eager=True) for b in rounds(s, lens, reqs, np.random.default_rng(seed))]
            for s in stacks
        ]
        for mode, want, *got in zip(MODES, *outs, strict=True):
            for i, g in enumerate(got):
                agree(g, want, mode, device, f"round {step} stack {i + 1}")
        for mode, want, e, g in zip(MODES, eager[0], eager[-1], outs[-1], strict=True):
            agree(e, want, mode, device, f"round {step} eager")
            agree(e, g, mode, device, "eager")
        for r in reqs:
            lens[r] += CHAIN.draft_forwards  # NOTE: the round's draft chain left the row this long


@pytest.mark.parametrize("model", ["tiny-llama-swa", "tiny-sinks"])
def test_pool_equals_full_layout_in_every_mode(device: torch.device, model: str) -> None:
    full, pooled = setup(device, model, False), setup(device, model, True)
    assert pooled.kv.window is not None and pooled.kv.window_layers == {0, 2}
    run_rounds([full, pooled], device)
    stats = pooled.runtime.stats()
    assert stats.fallbacks == {} and set(stats.replays) == {m.name for m in MODES}
    pool = pooled.runtime.window
    assert pool is not None
    held = [pool.held(r) for r in range(ROWS)]
    assert max(held) <= -(-(pool.window + pool.step) // PAGE) + 1, held
    assert pooled.kv.nbytes < full.kv.nbytes


def test_mapping_and_window_page_table_contents(device: torch.device) -> None:
    """After a replayed DECODE step: ``mapping[full slot]`` is the host's window slot of every
    position the rows hold; the window page table is the row's window pages from its window's
    first page to its last key, the window dummy page elsewhere (pad row included)."""
    s = setup(device, "tiny-llama-swa", True, modes=(M.DECODE,), debug=True)
    rng = np.random.default_rng(2)
    lens = [70, 9, 41]
    prefill(s, [0, 1, 2], lens, rng)
    s.runtime.run(decode_batch(s, [0, 1, 2], [n + 1 for n in lens], rng))
    pool, view = s.runtime.window, s.runtime.groups.view(M.DECODE, 4, 1).window
    assert pool is not None and view is not None
    table, dummy = view.page_table.cpu(), pool.dummy_page
    for i, (r, n) in enumerate(zip([0, 1, 2], [n + 1 for n in lens], strict=True)):
        lo = max(n - 1 - pool.window, 0) // PAGE
        need = -(-n // PAGE)
        expected = [int(pool.table[r, j]) if lo <= j < need else dummy for j in range(table.shape[1])]
        assert table[i].tolist() == expected, (r, n)
        assert min(expected[lo:need]) >= 0 and pool.owner[expected[lo:need]].tolist() == [r] * (need - lo)
        for p in range(lo * PAGE, n):
            assert int(pool.mapping[slot_of(s, r, p)]) == pool.table[r, p // PAGE] * PAGE + p % PAGE
        assert int(view.out_cache_loc[i, 0]) == pool.table[r, (n - 1) // PAGE] * PAGE + (n - 1) % PAGE
    assert table[3].tolist() == [dummy] * table.shape[1]
    assert view.out_cache_loc[3].tolist() == [pool.dummy_slot] * view.out_cache_loc.shape[1]


def test_draft_chain_slots_per_step(device: torch.device) -> None:
    """DRAFT_DECODE writes one window slot per chain step, column ``i`` for step ``i``."""
    s = setup(device, "tiny-llama-swa", True, modes=(M.DRAFT_DECODE,))
    rng = np.random.default_rng(3)
    prefill(s, [0, 1], [30, 50], rng)
    s.runtime.run(draft_batch(s, CHAIN, [1, 0], [30, 50], rng))
    pool, view = s.runtime.window, s.runtime.groups.view(M.DRAFT_DECODE, 4, 1).window
    assert pool is not None and view is not None
    for i, (r, n) in enumerate([(1, 50), (0, 30)]):
        want = [
            int(pool.table[r, (n + k) // PAGE]) * PAGE + (n + k) % PAGE for k in range(CHAIN.draft_forwards)
        ]
        assert view.out_cache_loc[i].tolist() == want


def test_refusals_leave_state_untouched() -> None:
    cpu = torch.device("cpu")
    s = setup(cpu, "tiny-llama-swa", True, modes=())
    rng = np.random.default_rng(4)
    prefill(s, [0], [80], rng)
    pool = s.runtime.window
    assert pool is not None
    before = (pool.table.copy(), pool.top, int(s.req_to_token.valid_lens[0]))
    with pytest.raises(
        KVIsolationError, match=r"reads window keys from position 16, but the window pool released"
    ):
        s.runtime.run(decode_batch(s, [0], [41], rng))  # NOTE: rewinds 40 positions
    assert np.array_equal(pool.table, before[0]) and pool.top == before[1]
    assert int(s.req_to_token.valid_lens[0]) == before[2]
    with pytest.raises(KVIsolationError, match="not shared with a window KV pool"):
        s.req_to_token.share_prefix(0, 1, 16)
    s.req_to_token.free(0)
    assert pool.held(0) == 0 and pool.top == pool.dummy_page
    with pytest.raises(ValueError, match=r"window KV pool supports chains only: speculative topk 2 > 1"):
        build_runtime(
            cpu, model="tiny-llama-swa", speculative=SpecGeometry(2, topk=2), window_pool=True, capture=False
        )
    with pytest.raises(ValueError, match="no sliding-window layers"):
        build_runtime(cpu, model="tiny-llama", window_pool=True, capture=False)


def test_prefill_larger_than_the_pool_is_refused() -> None:
    s = setup(torch.device("cpu"), "tiny-llama-swa", True, modes=())
    pool = s.runtime.window
    assert pool is not None
    with pytest.raises(KVIsolationError, match=r"the window KV pool has \d+ free page\(s\)"):
        prefill(s, [0, 1, 2, 3], [CONTEXT] * 4, np.random.default_rng(0))
    assert pool.top == pool.dummy_page and int(s.req_to_token.valid_lens.sum()) == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
@pytest.mark.parametrize("model", ["tiny-llama-swa", "tiny-sinks"])
def test_fa3_pool_matches_reference_full_layout(model: str) -> None:
    """FA3 reading the window pool == the reference on the full layout, both graphed (bf16)."""
    pytest.importorskip("sgl_kernel.flash_attn")
    cuda = torch.device("cuda")
    stacks = [setup(cuda, model, False), setup(cuda, model, True, backend="fa3")]
    assert stacks[1].runtime.backend.name == "fa3"
    run_rounds(stacks, cuda, rounds_=6)

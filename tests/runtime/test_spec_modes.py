"""Speculative modes: replay equals eager per mode, trees against dense oracles, pad rows, IDLE."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrt import Batch, ForwardMode
from graphrt.metadata.cascade import chain_tree_mask
from graphrt.step.modes import SpecGeometry
from tests.support.util import Setup, build_runtime, prefill, remade, slot_of, spec_batch

M = ForwardMode
CONTEXT, ROWS = 64, 8
SCRATCH = 12  # NOTE: rows ROWS.. hold tree branches, one row per (request, branch): no slot is shared


def setup_for(device: torch.device, spec: SpecGeometry, page_size: int = 16, **kw: object) -> Setup:
    modes = (M.DECODE, M.TARGET_VERIFY, M.DRAFT_EXTEND, M.IDLE)
    modes += (M.DRAFT_DECODE,) if spec.draft_forwards else ()
    return build_runtime(
        device,
        modes=modes,
        speculative=spec,
        buckets=(1, 2, 4),
        max_batch_size=4,
        max_reqs=ROWS + SCRATCH,
        page_size=page_size,
        max_context_len=CONTEXT,
        model="tiny-llama-draft",
        **kw,  # type: ignore[arg-type]
    )


def filled(setup: Setup, rng: np.random.Generator) -> list[int]:
    lens = [int(n) for n in rng.integers(3, CONTEXT // 2, ROWS)]
    prefill(setup, list(range(ROWS)), lens, rng)
    return lens


def verify_batch(setup: Setup, spec: SpecGeometry, reqs: list[int], lens: list[int], rng) -> Batch:
    n = spec.num_draft_tokens
    mask = None
    if spec.topk > 1:
        mask = np.broadcast_to(chain_tree_mask(spec.num_steps, spec.topk, n), (len(reqs), n, n)).copy()
    return Batch.create(
        M.TARGET_VERIFY,
        input_ids=rng.integers(0, setup.model.vocab_size, len(reqs) * n),
        seq_lens=[lens[r] + n for r in reqs],
        req_pool_indices=reqs,
        out_cache_loc=[slot_of(setup, r, p) for r in reqs for p in range(lens[r], lens[r] + n)],
        q_lens=[n] * len(reqs),
        tree_mask=mask,
    )


def draft_batch(setup: Setup, spec: SpecGeometry, reqs: list[int], lens: list[int], rng) -> Batch:
    """Branch ``j`` of the ``b``-th request ``r`` writes its step ``i`` at position ``lens[r] + i``
    of row ``r`` (chain) or of its own scratch row ``ROWS + b * topk + j`` (tree): page-aligned,
    and no two branches share a slot."""
    steps, k = spec.draft_forwards, spec.topk
    locs = [
        slot_of(setup, r if k == 1 else ROWS + b * k + j, lens[r] + i)
        for b, r in enumerate(reqs)
        for j in range(k)
        for i in range(steps)
    ]
    return Batch.create(
        M.DRAFT_DECODE,
        input_ids=rng.integers(0, setup.model.vocab_size, len(reqs) * k),
        seq_lens=[lens[r] + 1 for r in reqs],
        req_pool_indices=reqs,
        out_cache_loc=locs,
        q_lens=[k] * len(reqs),
    )


SPECS = [
    SpecGeometry(num_steps=3),
    SpecGeometry(num_steps=2, topk=3),
    SpecGeometry(num_steps=3, topk=2, num_draft_tokens=5),
]


@pytest.mark.parametrize("spec", SPECS, ids=["chain", "tree3x2", "tree2x3-pruned"])
@pytest.mark.parametrize("bs", [1, 3, 4])
def test_every_mode_replay_equals_eager(device: torch.device, spec: SpecGeometry, bs: int) -> None:
    setup = setup_for(device, spec)
    rng = np.random.default_rng(bs)
    lens = filled(setup, rng)
    reqs = [int(r) for r in rng.choice(4, bs, replace=False)]
    accept = [int(a) for a in rng.integers(1, spec.num_draft_tokens + 1, bs)]
    accept[0] = spec.num_draft_tokens  # NOTE: the maximum and (for bs > 1) 1 in one batch
    accept[-1] = 1 if bs > 1 else accept[-1]
    batches = [
        verify_batch(setup, spec, reqs, lens, rng),
        spec_batch(
            setup, M.DRAFT_EXTEND, reqs, [lens[r] + a for r, a in zip(reqs, accept, strict=True)], accept, rng
        ),
        draft_batch(setup, spec, reqs, lens, rng),
    ]
    tol = 2e-2 if device.type == "cuda" else 1e-5
    for batch in batches:
        graph = setup.runtime.run(batch)
        eager = setup.runtime.run(batch, eager=True)
        assert graph.shape == eager.shape
        if batch.mode is M.DRAFT_DECODE:
            assert graph.shape == (bs * spec.topk, spec.draft_forwards)
            assert torch.equal(graph, eager), batch.mode
        else:
            torch.testing.assert_close(graph, eager, atol=tol, rtol=tol, msg=batch.mode.name)
    assert setup.runtime.stats().fallbacks == {}
    assert set(setup.runtime.stats().replays) == {"TARGET_VERIFY", "DRAFT_EXTEND", "DRAFT_DECODE"}


def test_tree_shaped_as_chain_equals_causal_verify(device: torch.device) -> None:
    """A tree whose mask is a chain must give the causal chain's logits (cascade == causal)."""
    chain, tree = SpecGeometry(num_steps=3), SpecGeometry(num_steps=3, topk=2, num_draft_tokens=4)
    outs = []
    for spec in (chain, tree):
        setup = setup_for(device, spec, seed=3)
        rng = np.random.default_rng(7)
        lens = filled(setup, rng)
        batch = verify_batch(setup, chain, [2, 0], lens, rng)
        if spec.topk > 1:
            mask = np.broadcast_to(np.tril(np.ones((4, 4), dtype=bool)), (2, 4, 4)).copy()
            batch = remade(batch, tree_mask=mask)
        outs.append(setup.runtime.run(batch))
    tol = 3e-2 if device.type == "cuda" else 1e-4
    torch.testing.assert_close(outs[1], outs[0], atol=tol, rtol=tol)


def test_chain_draft_equals_greedy_decode_steps(device: torch.device) -> None:
    """DRAFT_DECODE (one graph, argmax inside) == the same steps as eager DECODE + argmax."""
    spec = SpecGeometry(num_steps=4)
    setup = setup_for(device, spec)
    rng = np.random.default_rng(11)
    lens = filled(setup, rng)
    reqs = [3, 1, 2]
    batch = draft_batch(setup, spec, reqs, lens, rng)
    drafted = setup.runtime.run(batch)
    tokens = torch.as_tensor(batch.input_ids)
    for i in range(spec.draft_forwards):
        step = Batch.create(
            M.DECODE,
            input_ids=tokens.tolist(),
            seq_lens=[lens[r] + 1 + i for r in reqs],
            req_pool_indices=reqs,
            out_cache_loc=[slot_of(setup, r, lens[r] + i) for r in reqs],
        )
        tokens = setup.runtime.run(step, eager=True).argmax(-1).cpu()
        assert drafted[:, i].cpu().tolist() == tokens.tolist(), f"step {i}"


def test_tree_draft_branch_equals_its_own_chain(device: torch.device) -> None:
    """Each branch of a topk draft attends prefix + its own slots: replay it as a chain on a
    scratch request whose table aliases the prefix slots (page size 1), token for token."""
    spec = SpecGeometry(num_steps=3, topk=3)
    setup = setup_for(device, spec, page_size=1)
    rng = np.random.default_rng(5)
    lens = filled(setup, rng)
    reqs = [0, 2]
    batch = draft_batch(setup, spec, reqs, lens, rng)
    drafted = setup.runtime.run(batch).cpu()
    scratch = 4
    for b, r in enumerate(reqs):
        for j in range(spec.topk):
            setup.req_to_token.share_prefix(r, scratch, lens[r])
            token = int(batch.input_ids[b * spec.topk + j])
            for i in range(spec.draft_forwards):
                step = Batch.create(
                    M.DECODE,
                    input_ids=[token],
                    seq_lens=[lens[r] + 1 + i],
                    req_pool_indices=[scratch],
                    out_cache_loc=[slot_of(setup, ROWS + b * spec.topk + j, lens[r] + i)],
                )
                token = int(setup.runtime.run(step, eager=True).argmax(-1))
                assert int(drafted[b * spec.topk + j, i]) == token, (r, j, i)


def test_shrink_inside_bucket_leaves_nothing_stale(device: torch.device) -> None:
    """Every mode: a full bucket, then a smaller batch in it; debug poison proves each buffer
    of each group the mode reads was rewritten, and pad rows hold exactly the pad values."""
    spec = SpecGeometry(num_steps=3, topk=2, num_draft_tokens=5)
    setup = setup_for(device, spec, debug=True)
    rng = np.random.default_rng(2)
    lens = filled(setup, rng)
    rt = setup.runtime
    for reqs in ([0, 1, 2, 3], [2, 0, 1]):
        accept = [int(a) for a in rng.integers(1, 6, len(reqs))]
        for batch in (
            verify_batch(setup, spec, reqs, lens, rng),
            spec_batch(
                setup,
                M.DRAFT_EXTEND,
                reqs,
                [lens[r] + a for r, a in zip(reqs, accept, strict=True)],
                accept,
                rng,
            ),
            draft_batch(setup, spec, reqs, lens, rng),
        ):
            rt.run(batch)  # debug=True raises PoisonLeft if a buffer kept poison
            tpr, pad = rt.rows_per_req(batch.mode), rt.pad_values(batch.mode)
            step = rt.buffers
            bad = step.pad_violations(4, tpr, len(reqs), pad) if batch.mode != M.DRAFT_EXTEND else []
            assert bad == [], (batch.mode, bad)
            view = step.view(4, tpr)
            assert (view.req_pool_indices[len(reqs) :] == pad["dummy_req"]).all()
            assert (view.cache_seqlens[len(reqs) :] == pad["pad_seq_len"]).all()
            assert int(view.cu_seqlens_q[-1]) == batch.num_tokens + (4 - len(reqs)) * pad["pad_q_len"]


def test_idle_step_runs_and_writes_nothing_live(device: torch.device) -> None:
    spec = SpecGeometry(num_steps=2)
    setup = setup_for(device, spec)
    rng = np.random.default_rng(0)
    filled(setup, rng)
    table = setup.req_to_token.table[:ROWS].clone()
    live = [k[: setup.kv.dummy_page].clone() for k in setup.kv.k]
    idle = Batch.create(M.IDLE, input_ids=[], seq_lens=[], req_pool_indices=[], out_cache_loc=[])
    for eager in (False, True):
        out = setup.runtime.run(idle, eager=eager)
        assert out.shape == (0, setup.model.vocab_size)
    assert setup.runtime.stats().replays["IDLE"] == 1
    assert torch.equal(setup.req_to_token.table[:ROWS], table)
    assert all(torch.equal(k[: setup.kv.dummy_page], v) for k, v in zip(setup.kv.k, live, strict=True))


def test_speculative_bad_input_is_rejected(device: torch.device) -> None:
    spec = SpecGeometry(num_steps=2, topk=2, num_draft_tokens=4)
    setup = setup_for(device, spec)
    rng = np.random.default_rng(0)
    lens = filled(setup, rng)
    chain = spec_batch(setup, M.TARGET_VERIFY, [0], [lens[0] + 4], [4], rng)
    with pytest.raises(ValueError, match=r"TARGET_VERIFY needs Batch.tree_mask"):
        setup.runtime.run(chain)
    short = spec_batch(setup, M.TARGET_VERIFY, [0], [lens[0] + 3], [3], rng)
    short = remade(short, tree_mask=np.tril(np.ones((1, 3, 3), dtype=bool)))
    with pytest.raises(ValueError, match=r"takes 4 token\(s\) per request, got q_len 3"):
        setup.runtime.run(short)
    long = spec_batch(setup, M.DRAFT_EXTEND, [0], [lens[0] + 5], [5], rng)
    with pytest.raises(ValueError, match=r"q_len 5 > num_draft_tokens 4"):
        setup.runtime.run(long)
    for nodes, why in ((3, r"must be \[bs, q_len, q_len\]"), (2, r"only earlier tokens")):
        with pytest.raises(ValueError, match=why):  # a mask of the wrong shape; one that sees ahead
            Batch.create(
                M.TARGET_VERIFY,
                input_ids=[1, 2],
                seq_lens=[5],
                req_pool_indices=[0],
                out_cache_loc=[3, 4],
                q_lens=[2],
                tree_mask=np.ones((1, nodes, nodes), dtype=bool),
            )
    twice = spec_batch(setup, M.DRAFT_EXTEND, [0, 1], [lens[0] + 1, lens[1] + 1], [1, 1], rng)
    twice = remade(twice, out_cache_loc=[twice.out_cache_loc[0]] * 2)
    with pytest.raises(
        ValueError, match=r"out_cache_loc must be distinct within a batch: slot \d+ appears 2 times"
    ):
        setup.runtime.run(twice)
    with pytest.raises(ValueError, match=r"num_draft_tokens 9 must lie in \[2, 1 \+ topk \* num_steps = 5\]"):
        SpecGeometry(num_steps=2, topk=2, num_draft_tokens=9)

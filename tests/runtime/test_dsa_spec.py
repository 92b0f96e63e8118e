"""DSA (sparse MLA) in the speculative modes, BF16 and FP8-656 KV, graphed and eager.

Replay == eager for TARGET_VERIFY (chain and token tree), DRAFT_EXTEND (ragged) and
DRAFT_DECODE (chain and tree) in full and shrunk buckets; a chain draft == eager DECODE steps
with argmax; a tree draft branch == its own chain; each token of a verify tree == the same
token verified on its own path, and selects only its prefix and its ancestors.

NOTE: the equivalences across step shapes (tree vs chain, draft vs DECODE) compare two
different forwards. On CUDA (bf16 activations) they use prefixes shorter than ``index_topk``,
where the selection is every allowed key, so a near-tie in the indexer cannot flip a key; on
the CPU (float32) prefixes reach well past ``index_topk``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrt import Batch, ForwardMode
from graphrt.metadata.cascade import chain_tree_mask
from graphrt.step.modes import SpecGeometry
from tests.runtime.spec_checks import (
    check_chain_draft,
    check_replay_equals_eager,
    check_tree_paths,
    scratch_chain,
    spec_runtime,
    tol,
    tree_paths,
)
from tests.runtime.test_spec_modes import ROWS, SCRATCH, draft_batch, verify_batch
from tests.support.util import Setup, prefill, slot_of

M = ForwardMode
TOPK = 64  # tiny-dsa's index_topk
CONTEXT = 160
CHAIN = SpecGeometry(num_steps=3)
TREE = SpecGeometry(num_steps=3, topk=2, num_draft_tokens=5)  # token 4 is token 1's sibling
LAYOUTS = ["bf16", "fp8"]
_CACHE: dict[tuple[str, str, SpecGeometry], Setup] = {}


def dsa(device: torch.device, layout: str, spec: SpecGeometry) -> Setup:
    """One captured runtime per (device, layout, geometry); every test prefills what it reads."""
    key = (device.type, layout, spec)
    if key not in _CACHE:
        backend = None if device.type == "cuda" else "reference"
        modes = (M.TARGET_VERIFY, M.DRAFT_EXTEND, M.DRAFT_DECODE)
        _CACHE[key] = spec_runtime(
            device, "tiny-dsa", spec, modes, CONTEXT, kv_cache_dtype=layout, backend=backend
        )
    return _CACHE[key]


def fresh(setup: Setup) -> None:
    """Free every row: the runtime is shared, and earlier tests' requests are done."""
    for row in range(ROWS + SCRATCH):
        setup.req_to_token.free(row)


def filled(setup: Setup, rng: np.random.Generator, device: torch.device, long: bool = True) -> list[int]:
    """Prefill rows ``0..ROWS-1``; ``long``: lengths on both sides of ``index_topk`` (CPU)."""
    high = CONTEXT - 16 if long and device.type == "cpu" else TOPK - 8
    lens = [int(n) for n in rng.integers(8, high, ROWS)]
    if long and device.type == "cpu":
        lens[0] = high  # NOTE: at least one request selects from > 2 x index_topk keys
    fresh(setup)
    prefill(setup, list(range(ROWS)), lens, rng)
    return lens


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("spec", [CHAIN, TREE], ids=["chain", "tree"])
def test_every_spec_mode_replay_equals_eager(device: torch.device, layout: str, spec: SpecGeometry) -> None:
    setup = dsa(device, layout, spec)
    rng = np.random.default_rng(0)
    check_replay_equals_eager(setup, spec, filled(setup, rng, device), rng, tol(device))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_chain_draft_equals_greedy_decode_steps(device: torch.device, layout: str) -> None:
    """DRAFT_DECODE (one graph, argmax inside) == eager DECODE steps + argmax, token for token."""
    setup = dsa(device, layout, CHAIN)
    rng = np.random.default_rng(11)
    check_chain_draft(setup, CHAIN, [3, 0, 2], filled(setup, rng, device), rng)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_tree_draft_branch_equals_its_own_chain(device: torch.device, layout: str) -> None:
    """Branch ``j`` of a topk draft attends the prefix and its own draft slots only: replayed as
    a chain of DECODE steps on a scratch row that aliases the prefix, it drafts the same tokens."""
    setup = dsa(device, layout, TREE)
    rng = np.random.default_rng(5)
    lens = filled(setup, rng, device)
    reqs, k = [0, 2], TREE.topk
    batch = draft_batch(setup, TREE, reqs, lens, rng)
    drafted = setup.runtime.run(batch).cpu()
    scratch = ROWS + SCRATCH - 1  # NOTE: draft_batch's branch rows are ROWS .. ROWS + 2 * k - 1
    for b, r in enumerate(reqs):
        for j in range(k):
            scratch_chain(setup, scratch, r, lens[r], pages_of=ROWS + b * k + j)
            token = int(batch.input_ids[b * k + j])
            for i in range(TREE.draft_forwards):
                step = Batch.create(
                    M.DECODE,
                    input_ids=[token],
                    seq_lens=[lens[r] + 1 + i],
                    req_pool_indices=[scratch],
                    out_cache_loc=[slot_of(setup, ROWS + b * k + j, lens[r] + i)],
                )
                token = int(setup.runtime.run(step, eager=True).argmax(-1))
                assert int(drafted[b * k + j, i]) == token, (r, j, i)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_tree_verify_equals_each_path_as_chain(device: torch.device, layout: str) -> None:
    """Each tree token's logits == the last token of its own path, prefilled causally (EXTEND)
    on a scratch row that aliases the prefix: siblings and cousins never reach the indexer."""
    setup = dsa(device, layout, TREE)
    rng = np.random.default_rng(7)
    check_tree_paths(setup, TREE, [0, 3], filled(setup, rng, device), rng, tol(device))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_tree_tokens_select_only_prefix_and_ancestors(device: torch.device, layout: str) -> None:
    """After a graphed tree verify, every token's selected slots lie in its prefix or among its
    ancestors' real KV slots, and it keeps ``min(index_topk, allowed keys)`` of them."""
    setup = dsa(device, layout, TREE)
    rng = np.random.default_rng(9)
    lens = [TOPK - 6, 2 * TOPK, 20, CONTEXT - 16]  # NOTE: the tree straddles index_topk for row 0
    fresh(setup)
    prefill(setup, [0, 1, 2, 3], lens, rng)
    reqs, n = [0, 1, 2, 3], TREE.num_draft_tokens
    setup.runtime.run(verify_batch(setup, TREE, reqs, lens, rng))
    slots = setup.runtime.groups.groups["attention"].view(4, n).topk_slots[:, :TOPK].cpu()
    positions = setup.runtime.groups.groups["attention"].view(4, n).topk_indices.cpu()
    for b, r in enumerate(reqs):
        prefix = {slot_of(setup, r, p) for p in range(lens[r])}
        for t, path in enumerate(tree_paths(chain_tree_mask(TREE.num_steps, TREE.topk, n))):
            allowed = prefix | {slot_of(setup, r, lens[r] + a) for a in path}
            chosen = [s for s in slots[b * n + t].tolist() if s >= 0]
            assert set(chosen) <= allowed, (r, t, sorted(set(chosen) - allowed))
            assert len(chosen) == len(set(chosen)) == min(TOPK, len(allowed)), (r, t)
            picked = {int(p) for p in positions[b * n + t] if p >= 0}
            assert picked <= set(range(lens[r] + len(path))), (r, t)  # positions on its own path

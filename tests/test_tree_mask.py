"""Issue 24.3: a token-tree mask must be a tree, else ``Batch.create`` refuses it.

A token's RoPE position is ``seq_len - q_len + depth`` with its depth its ancestor count, and
it attends exactly its ancestors; a mask where node 4 lists node 2 without node 2's parent
would place node 4 one position off from the path it attends. Refused naming the request and
the token; random masks are accepted exactly when a parent per token reproduces them.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrt import Batch, ForwardMode
from graphrt.metadata.cascade import chain_tree_mask
from graphrt.step.modes import SpecGeometry
from graphrt.step.tree_mask import tree_mask_of
from tests.state import assert_same_state, state_of
from tests.test_spec_modes import filled, setup_for, verify_batch
from tests.util import remade

SPEC = SpecGeometry(num_steps=3, topk=2, num_draft_tokens=5)  # 0 -> 1 -> 2 -> 3, 0 -> 4


def not_a_tree() -> np.ndarray:
    """The issue's mask: node 4 lists node 2 (and the root) but not node 1, 2's parent."""
    mask = chain_tree_mask(3, 2, 5).copy()
    mask[4] = False
    mask[4, [0, 2, 4]] = True
    return mask


def is_tree(mask: np.ndarray) -> bool:
    """The reference: row ``i`` is row ``p`` plus ``i`` for some ancestor ``p < i``."""
    n = len(mask)
    eye = np.eye(n, dtype=bool)
    if mask[0].tolist() != eye[0].tolist():
        return False
    return all(
        any(mask[i, p] and (mask[i] == (mask[p] | eye[i])).all() for p in range(i)) for i in range(1, n)
    )


@pytest.mark.parametrize("eager", [False, True], ids=["graph", "eager"])
def test_verify_with_a_mask_that_is_not_a_tree_is_refused(device: torch.device, eager: bool) -> None:
    setup = setup_for(device, SPEC)
    rng = np.random.default_rng(0)
    lens = filled(setup, rng)
    good = verify_batch(setup, SPEC, [0, 2], lens, rng)
    mask = good.tree_mask.copy()
    mask[1] = not_a_tree()
    before = state_of(setup.runtime)
    with pytest.raises(ValueError, match=r"not a tree: request 1 token 4 has ancestors \[0, 2\]; its parent"):
        setup.runtime.run(remade(good, tree_mask=mask), eager=eager)
    assert_same_state(setup.runtime, before)
    setup.runtime.run(good, eager=eager)  # the tree itself runs
    depth = good.tree_mask.sum(axis=2).reshape(-1) - 1
    assert good.positions.tolist() == (np.repeat(good.seq_lens - 5, 5) + depth).tolist()


def test_random_masks_are_accepted_exactly_when_they_are_trees() -> None:
    rng = np.random.default_rng(1)
    n, seen = 6, {True: 0, False: 0}
    eye = np.eye(n, dtype=bool)
    for _ in range(400):
        if rng.random() < 0.5:  # a tree from random parents, sometimes one entry flipped
            mask = eye.copy()
            for i in range(1, n):
                mask[i] |= mask[int(rng.integers(0, i))]
            if rng.random() < 0.5:
                i = int(rng.integers(2, n))
                mask[i, int(rng.integers(1, i))] ^= True
        else:  # any lower-triangular mask through the root
            mask = np.tril(rng.random((n, n)) < 0.5) | eye
        mask[:, 0] = True
        want = is_tree(mask)
        seen[want] += 1
        if want:
            tree_mask_of(mask[None], np.array([n]))
        else:
            with pytest.raises(ValueError, match=r"not a tree: request 0 token \d"):
                tree_mask_of(mask[None], np.array([n]))
    assert min(seen.values()) > 50, seen


def test_engine_trees_pass() -> None:
    """Every draft tree the speculative engine builds is a tree."""
    for steps, topk, nodes in [(3, 2, 5), (2, 3, 7), (4, 4, 9), (3, 1, 4)]:
        mask = chain_tree_mask(steps, topk, nodes)
        assert is_tree(mask)
        tree_mask_of(mask[None], np.array([nodes]))
    with pytest.raises(ValueError, match="not a tree"):
        Batch.create(
            ForwardMode.TARGET_VERIFY,
            input_ids=[1] * 5,
            seq_lens=[9],
            req_pool_indices=[0],
            out_cache_loc=list(range(4, 9)),
            q_lens=[5],
            tree_mask=not_a_tree()[None],
        )

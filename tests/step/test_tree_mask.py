"""A token-tree mask must be a tree: each token's ancestors are its parent's path plus the parent."""

from __future__ import annotations

import numpy as np
import pytest

from graphrt.metadata.cascade import chain_tree_mask
from graphrt.step.values import tree_mask


def _mask(rows: list[list[int]]) -> np.ndarray:
    n = len(rows)
    mask = np.zeros((1, n, n), dtype=bool)
    for i, ancestors in enumerate(rows):
        mask[0, i, [*ancestors, i]] = True
    return mask


def test_trees_from_the_draft_shape_pass() -> None:
    for steps, topk in [(1, 1), (3, 1), (2, 2), (3, 4)]:
        mask = chain_tree_mask(steps, topk)[None]
        assert tree_mask(mask, np.array([mask.shape[1]])) is not None


def test_a_token_that_skips_its_ancestors_parent_is_refused() -> None:
    # NOTE: token 4 lists token 2 but not 2's parent 1: no single root path reaches it.
    mask = _mask([[], [0], [0, 1], [0], [0, 2]])
    with pytest.raises(
        ValueError, match=r"not a tree: token 4 of request 0 lists \[0, 2, 4\], but its parent 2"
    ):
        tree_mask(mask, np.array([5]))


def test_two_branches_merged_into_one_token_are_refused() -> None:
    mask = _mask([[], [0], [0], [0, 1, 2]])  # token 3 below both 1 and 2
    with pytest.raises(
        ValueError,
        match=r"token 3 of request 0 lists \[0, 1, 2, 3\], but its parent 2 with its own path gives \[0, 2, 3\]",
    ):
        tree_mask(mask, np.array([4]))


def test_batch_create_refuses_a_mask_that_is_not_a_tree() -> None:
    """The issue's attack at the public door: token 4 lists token 2 without 2's parent 1."""
    from graphrt import Batch, ForwardMode

    args = dict(
        input_ids=[1] * 5, seq_lens=[12], req_pool_indices=[0], out_cache_loc=range(20, 25), q_lens=[5]
    )
    good = _mask([[], [0], [0, 1], [0], [0, 3]])
    assert Batch.create(ForwardMode.TARGET_VERIFY, tree_mask=good, **args).positions.tolist() == [
        7,
        8,
        9,
        8,
        9,
    ]
    with pytest.raises(ValueError, match=r"not a tree: token 4 of request 0 lists \[0, 2, 4\]"):
        Batch.create(ForwardMode.TARGET_VERIFY, tree_mask=_mask([[], [0], [0, 1], [0], [0, 2]]), **args)

"""A verify step's token tree: the ancestor-or-self mask of ``Batch.tree_mask``, checked.

Token ``i`` of a request sits at position ``seq_len - q_len + depth(i)`` with ``depth(i)`` its
ancestor count, and attends exactly its ancestors: both come from one mask, so the mask must
be a tree rooted at token 0 (each token's ancestors are its parent's plus the parent), or the
RoPE position of a token and the keys it attends would disagree.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def tree_mask_of(value: Any, q_lens: np.ndarray) -> np.ndarray:
    """A ``[bs, n, n]`` bool ancestor-or-self mask whose rows form a tree rooted at token 0."""
    mask = np.asarray(value.numpy() if isinstance(value, torch.Tensor) else value)
    if mask.dtype != np.bool_:
        raise TypeError(f"Batch.tree_mask must be bool, got dtype {mask.dtype}")
    n = int(q_lens[0]) if q_lens.size else 0
    if mask.shape != (q_lens.size, n, n) or (q_lens != n).any():
        raise ValueError(
            f"Batch.tree_mask must be [bs, q_len, q_len] = {(q_lens.size, n, n)}, got {mask.shape}"
        )
    eye = np.eye(n, dtype=bool)
    if not (mask[:, eye]).all() or (mask & ~np.tril(np.ones((n, n), dtype=bool))).any():
        raise ValueError("Batch.tree_mask must hold each token itself and only earlier tokens (ancestors)")
    if n and not mask[:, :, 0].all():
        raise ValueError("Batch.tree_mask: every token must descend from token 0 (the root)")
    _check_tree(mask)
    return mask


def _check_tree(mask: np.ndarray) -> None:
    """Each token's ancestors are its parent's (its latest ancestor's) plus the parent.

    NOTE: a token's depth is its ancestor count (its RoPE position), so a set that is not a
    root path would place the token at a position its attention disagrees with.
    """
    bs, n, _ = mask.shape
    if n < 2:
        return
    strict = mask & ~np.eye(n, dtype=bool)
    parent = n - 1 - np.argmax(strict[:, 1:, ::-1], axis=2)  # [bs, n - 1] latest ancestor
    rows = np.arange(bs)[:, None]
    expect = mask[rows, parent] | np.eye(n, dtype=bool)[1:]
    wrong = (expect != mask[:, 1:]).any(axis=2)
    if wrong.any():
        b, i = (int(x) for x in np.argwhere(wrong)[0])
        p = int(parent[b, i])
        have = np.flatnonzero(strict[b, i + 1]).tolist()
        want = np.flatnonzero(expect[b, i] & ~np.eye(n, dtype=bool)[i + 1]).tolist()
        raise ValueError(
            f"Batch.tree_mask is not a tree: request {b} token {i + 1} has ancestors {have}; its "
            f"parent (latest ancestor) is {p}, so they must be {want} (the parent's ancestors "
            "plus the parent)"
        )

"""Host-side value checks shared by batch validation: integer arrays, ranges, distinctness,
and the token-tree mask (a root path per token)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from graphrt.step.ints import first_non_int

INT64_MIN, INT64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)


def host_ints(name: str, value: Any) -> np.ndarray:
    """``Batch.<name>`` as a 1-D int64 array: integers (a list or tuple of ints, an integer
    numpy array or CPU tensor); ``TypeError`` names the index of a float, string or bool."""
    if type(value) is np.ndarray and value.dtype == np.int64 and value.ndim == 1:
        return value  # NOTE: the fast path: already what a batch holds, no conversion
    bad = first_non_int(value)
    if bad >= 0 and not isinstance(value[bad], (list, tuple, np.ndarray)):  # NOTE: nested: the 1-D check
        # NOTE: np.asarray turns [1, True] into ints and [1, 2.0] into floats: checked as given
        v = value[bad]
        raise TypeError(f"Batch.{name}[{bad}] is {v!r} ({type(v).__name__}): must be an int")
    if isinstance(value, torch.Tensor):
        if value.device.type != "cpu":
            raise ValueError(
                f"Batch.{name} is on {value.device}; batches hold host data (numpy or CPU "
                "tensors) so validation needs no device sync"
            )
        value = value.numpy()
    arr = np.asarray(value)
    if arr.size and arr.dtype.kind not in "iu":
        check_wide_ints(name, value)
        raise TypeError(f"Batch.{name} must hold integers, got dtype {arr.dtype}")
    if arr.ndim != 1:
        raise ValueError(f"Batch.{name} must be 1-D, got shape {arr.shape}")
    if arr.size and arr.dtype == np.uint64 and int(arr.max()) > INT64_MAX:
        # NOTE: reported as given; the cast below would wrap 2**64-1 to -1.
        raise ValueError(f"Batch.{name}: {int(arr.max())} does not fit int64 [{INT64_MIN}, {INT64_MAX}]")
    return arr.astype(np.int64, copy=False)


def check_wide_ints(name: str, value: Any) -> None:
    """Python ints past int64 make numpy pick float64 or object: report them as given."""
    if isinstance(value, (list, tuple)):
        wide = [v for v in value if isinstance(v, int) and not INT64_MIN <= v <= INT64_MAX]
        if wide:
            raise ValueError(f"Batch.{name}: {wide[0]} does not fit int64 [{INT64_MIN}, {INT64_MAX}]")


def distinct(name: str, arr: np.ndarray, what: str) -> None:
    """Raise when a value repeats (two requests in one row, two tokens in one KV slot)."""
    values, counts = np.unique(arr, return_counts=True)
    if (counts > 1).any():
        value = int(values[counts > 1][0])
        raise ValueError(
            f"{name} must be distinct within a batch: {what} {value} appears {int(counts.max())} times"
        )


def in_range(name: str, arr: np.ndarray, lo: int, hi: int, what: str = "value") -> None:
    bad = (arr < lo) | (arr >= hi)
    if bad.any():
        value = int(arr[bad][0])
        raise ValueError(f"{what} out of range in {name}: {value} not in [{lo}, {hi})")


def tree_mask(value: Any, q_lens: np.ndarray) -> np.ndarray:
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
    _check_paths(mask)
    return mask


def _check_paths(mask: np.ndarray) -> None:
    """Each token's ancestors are its parent's ancestors plus the parent: one root path.

    The parent of token ``i`` is its latest listed ancestor. A row that lists an ancestor
    without that ancestor's own ancestors (or skips a level) is not a path from the root, and
    depths taken from ancestor counts would give RoPE positions the mask disagrees with.
    """
    n = mask.shape[1]
    if n < 2:
        return
    strict = mask & ~np.eye(n, dtype=bool)
    parent = n - 1 - np.argmax(strict[:, :, ::-1], axis=-1)  # [bs, n]; token 0: n - 1 (unused)
    expected = np.take_along_axis(mask, parent[:, :, None], axis=1) | np.eye(n, dtype=bool)
    expected[:, 0] = np.eye(n, dtype=bool)[0]
    bad = (expected != mask).any(-1)
    if bad.any():
        b, i = (int(v) for v in np.argwhere(bad)[0])
        listed = np.flatnonzero(mask[b, i]).tolist()
        want = np.flatnonzero(expected[b, i]).tolist()
        raise ValueError(
            f"Batch.tree_mask is not a tree: token {i} of request {b} lists {listed}, but its parent "
            f"{int(parent[b, i])} with its own path gives {want}"
        )

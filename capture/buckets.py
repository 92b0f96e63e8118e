"""Which batch sizes get a graph, and which graph a batch of ``bs`` requests uses."""

from __future__ import annotations

import bisect
import itertools
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


def default_buckets(max_batch_size: int) -> tuple[int, ...]:
    """1, 2, 4, 8, 12, 16, 24, … (step 8) … 256, then step 16, capped; the max always in."""
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
    ladder = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, max_batch_size + 1, 16)]
    return tuple(sorted({b for b in ladder if b < max_batch_size} | {max_batch_size}))


@dataclass(frozen=True, slots=True)
class BucketPolicy:
    """Sorted captured batch sizes. ``bucket_for(bs)`` is the smallest bucket >= bs."""

    buckets: tuple[int, ...]

    @classmethod
    def create(cls, max_batch_size: int, buckets: Sequence[int] | None = None) -> BucketPolicy:
        """The default ladder, or the user's list (which must include ``max_batch_size``)."""
        if buckets is None:
            return cls(default_buckets(max_batch_size))
        chosen = sorted(set(buckets))
        if not chosen or chosen[0] < 1 or chosen[-1] > max_batch_size:
            raise ValueError(f"buckets must lie in 1..{max_batch_size}, got {list(buckets)}")
        return cls(tuple(sorted(set(chosen) | {max_batch_size})))

    @classmethod
    def exact(cls, buckets: Sequence[int], allocation: int) -> BucketPolicy:
        """``buckets`` as given, after checking they are sorted unique ints in 1..``allocation``.

        Unlike :meth:`create` nothing is added or reordered: a ladder whose largest bucket is
        below ``allocation`` is allowed (larger batches then run eagerly, counted).
        """
        chosen = list(buckets)
        if not chosen:
            raise ValueError("buckets must name at least one batch size, got []")
        for b in chosen:
            if isinstance(b, bool) or not isinstance(b, numbers.Integral):
                raise ValueError(f"bucket {b!r} is not an integer (buckets: {chosen})")
            if not 1 <= b <= allocation:
                raise ValueError(
                    f"bucket {b} is outside 1..{allocation}: the static buffers hold {allocation} "
                    "requests (max_batch_size); build the runtime with a larger one"
                )
        for prev, b in itertools.pairwise(chosen):
            if b <= prev:
                raise ValueError(f"buckets must be sorted and unique: {b} follows {prev} in {chosen}")
        return cls(tuple(int(b) for b in chosen))

    @property
    def largest(self) -> int:
        """The largest captured batch size."""
        return self.buckets[-1]

    def bucket_for(self, bs: int) -> int | None:
        """Smallest bucket >= bs, or None when bs exceeds the largest bucket."""
        i = bisect.bisect_left(self.buckets, bs)
        return self.buckets[i] if i < len(self.buckets) else None


def padded_tokens(weights: Mapping[int, int], buckets: Sequence[int]) -> int:
    """Σ over sizes of ``weights[bs] * (bucket_for(bs) - bs)``: the pad rows a ladder costs.

    ``weights[bs]`` is how many token rows one request of that size stands for, summed over
    the steps observed (steps × rows per request). Sizes above the largest bucket are not
    padded (they run eagerly) and cost nothing here.
    """
    ladder = sorted(buckets)
    total = 0
    for bs, weight in weights.items():
        i = bisect.bisect_left(ladder, bs)
        if i < len(ladder):
            total += weight * (ladder[i] - bs)
    return total


def optimal_buckets(
    weights: Mapping[int, int], max_graphs: int, largest: int | None = None
) -> tuple[int, ...]:
    """At most ``max_graphs`` buckets, ``largest`` among them, minimising :func:`padded_tokens`.

    An exact dynamic program over the k distinct sizes with a positive weight, O(k² ·
    max_graphs) (vectorised over one axis): with fewest graphs an optimal ladder puts every
    bucket but ``largest`` on an observed size (a bucket above every size it serves can be
    lowered to the largest of them for free). Ties go to the fewest graphs, then to the
    ladder whose second-largest bucket is smallest, then its third-largest, and so on.

    Parameters
    ----------
    weights : Mapping[int, int]
        Batch size → pad rows per unit of padding (e.g. steps × tokens per request); sizes
        with weight 0 are ignored.
    max_graphs : int
        Buckets at most (≥ 1).
    largest : int, optional
        A bucket that must be in the ladder, ≥ every weighted size (e.g. ``max_batch_size``,
        so that no batch the buffers hold falls back to eager); default: the largest size.
    """
    if max_graphs < 1:
        raise ValueError(f"max_graphs must be >= 1, got {max_graphs}")
    sizes = sorted(bs for bs, w in weights.items() if w)
    bad = [(bs, w) for bs, w in weights.items() if bs < 1 or w < 0]
    if bad:
        raise ValueError(f"batch sizes must be >= 1 and weights >= 0, got (bs, weight) {bad[:3]}")
    if not sizes:
        raise ValueError("no batch sizes observed (every weight is 0 or the histogram is empty)")
    top = sizes[-1] if largest is None else largest
    if top < sizes[-1]:
        raise ValueError(f"largest bucket {top} is below the largest observed batch size {sizes[-1]}")
    points = sizes if sizes[-1] == top else [*sizes, top]
    w = np.array([weights.get(p, 0) for p in points], dtype=np.int64)
    return tuple(points[i] for i in _solve(np.array(points, dtype=np.int64), w, max_graphs))


def _solve(p: np.ndarray, w: np.ndarray, max_graphs: int) -> list[int]:
    """Indices of the optimal buckets among points ``p`` (sorted; the last one always in).

    ``f[g][j]``: least padding of points 0..j with exactly g + 1 buckets, the top one at j.
    """
    m = len(p)
    cum_w = np.concatenate(([0], np.cumsum(w)))
    cum_wp = np.concatenate(([0], np.cumsum(w * p)))
    # cost[i, j]: points i+1..j served by bucket p[j] (valid for i < j)
    cost = p[None, :] * (cum_w[None, 1:] - cum_w[1:, None]) - (cum_wp[None, 1:] - cum_wp[1:, None])
    below = np.tri(m, m, -1, dtype=bool).T  # below[i, j] = i < j
    f = [p * cum_w[1:] - cum_wp[1:]]
    valid = [np.ones(m, dtype=bool)]
    back: list[np.ndarray] = [np.zeros(m, dtype=np.int64)]
    for g in range(1, min(max_graphs, m)):
        ok = below & valid[-1][:, None]
        cand = np.where(ok, np.where(valid[-1], f[-1], 0)[:, None] + cost, np.iinfo(np.int64).max)
        back.append(np.argmin(cand, axis=0))  # NOTE: argmin takes the first: the smallest i
        f.append(cand[back[-1], np.arange(m)])
        valid.append(np.arange(m) >= g)
    g = min(range(len(f)), key=lambda k: (f[k][m - 1], k))
    chosen, j = [m - 1], m - 1
    for level in range(g, 0, -1):
        j = int(back[level][j])
        chosen.append(j)
    return chosen[::-1]

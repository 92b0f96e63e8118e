"""Which batch sizes get a graph, and which graph a batch of ``bs`` requests uses."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass


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

    @property
    def largest(self) -> int:
        """The largest captured batch size."""
        return self.buckets[-1]

    def bucket_for(self, bs: int) -> int | None:
        """Smallest bucket >= bs, or None when bs exceeds the largest bucket."""
        i = bisect.bisect_left(self.buckets, bs)
        return self.buckets[i] if i < len(self.buckets) else None

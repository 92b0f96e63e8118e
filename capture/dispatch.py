"""Dispatch a step to the graph of (mode, smallest bucket >= bs), or count why it runs eagerly."""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass

from graphrt.capture.buckets import BucketPolicy
from graphrt.capture.graph import Graph


@dataclass(frozen=True, slots=True)
class Fallback:
    """Why a step ran eagerly."""

    mode: Hashable
    reason: str


class Dispatcher:
    """Graphs keyed by ``(mode, bucket)``; counts replays and eager fallbacks per mode."""

    def __init__(self, policy: BucketPolicy) -> None:
        self.policy = policy
        self.graphs: dict[tuple[Hashable, int], Graph] = {}
        self.replays: Counter[Hashable] = Counter()
        self.fallbacks: Counter[Fallback] = Counter()

    def add(self, mode: Hashable, bucket: int, graph: Graph) -> None:
        """Register the graph of ``(mode, bucket)``; the bucket must be one of the policy's."""
        if bucket not in self.policy.buckets:
            raise ValueError(f"bucket {bucket} is not in the policy {self.policy.buckets}")
        self.graphs[(mode, bucket)] = graph

    def replace(self, policy: BucketPolicy) -> None:
        """Drop every graph and dispatch by ``policy`` from now on (counters keep counting)."""
        self.graphs.clear()
        self.policy = policy

    def captured_modes(self) -> set[Hashable]:
        """Every mode with at least one graph."""
        return {mode for mode, _ in self.graphs}

    def select(self, mode: Hashable, bs: int) -> tuple[int, Graph] | Fallback:
        """The bucket and graph for ``bs`` requests, or the reason there is none."""
        bucket = self.policy.bucket_for(bs)
        if bucket is None:
            return Fallback(mode, f"bs {bs} > largest bucket {self.policy.largest}")
        graph = self.graphs.get((mode, bucket))
        if graph is None:
            return Fallback(mode, f"mode {_name(mode)} not captured")
        return bucket, graph

    def count_fallback(self, fallback: Fallback) -> None:
        """Count one eager step taken for ``fallback``'s reason."""
        self.fallbacks[fallback] += 1

    def count_replay(self, mode: Hashable) -> None:
        """Count one replay of a ``mode`` graph."""
        self.replays[mode] += 1


def _name(mode: Hashable) -> str:
    return getattr(mode, "name", str(mode))

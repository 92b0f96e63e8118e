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
    """Graphs keyed by ``(mode, bucket)``; counts replays and eager fallbacks per mode.

    ``policy`` buckets every mode by its requests; ``own`` gives a mode a ladder of its own
    (a token-bucketed mode: its buckets count query tokens, and ``select`` takes that count).
    """

    def __init__(self, policy: BucketPolicy, own: dict[Hashable, BucketPolicy] | None = None) -> None:
        self.policy = policy
        self.own: dict[Hashable, BucketPolicy] = dict(own or {})
        self.graphs: dict[tuple[Hashable, int], Graph] = {}
        self.replays: Counter[Hashable] = Counter()
        self.fallbacks: Counter[Fallback] = Counter()

    def policy_for(self, mode: Hashable) -> BucketPolicy:
        """The ladder ``mode`` is captured and dispatched by."""
        return self.own.get(mode, self.policy)

    def add(self, mode: Hashable, bucket: int, graph: Graph) -> None:
        """Register the graph of ``(mode, bucket)``; the bucket must be one of the mode's policy's."""
        buckets = self.policy_for(mode).buckets
        if bucket not in buckets:
            raise ValueError(f"bucket {bucket} is not in the policy {buckets}")
        self.graphs[(mode, bucket)] = graph

    def replace(self, policy: BucketPolicy) -> None:
        """Drop every graph and dispatch by ``policy`` from now on (counters keep counting;
        modes with a ladder of their own keep it)."""
        self.graphs.clear()
        self.policy = policy

    def captured_modes(self) -> set[Hashable]:
        """Every mode with at least one graph."""
        return {mode for mode, _ in self.graphs}

    def select(self, mode: Hashable, bs: int) -> tuple[int, Graph] | Fallback:
        """The bucket and graph for ``bs`` requests (tokens, for a mode with a ladder of its
        own), or the reason there is none."""
        policy = self.own.get(mode)
        what = "bs" if policy is None else "tokens"
        policy = policy or self.policy
        bucket = policy.bucket_for(bs)
        if bucket is None:
            return Fallback(mode, f"{what} {bs} > largest bucket {policy.largest}")
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

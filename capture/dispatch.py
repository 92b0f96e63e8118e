"""Dispatch a step to the graph of (mode, smallest bucket >= bs), or count why it runs eagerly.

A key may also be *pending* (lazy capture): it belongs to the ladder, but its graph is made the
first time a step needs it. :meth:`Dispatcher.select` then answers :class:`Pending`, and the
caller captures it and selects again; a key whose capture failed answers a :class:`Fallback`
naming the failure from then on.
"""

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


@dataclass(frozen=True, slots=True)
class Pending:
    """The step's ``(mode, bucket)`` is in the ladder but not captured yet: capture it first."""

    mode: Hashable
    bucket: int


class Dispatcher:
    """Graphs keyed by ``(mode, bucket)``; counts replays and eager fallbacks per mode.

    ``policy`` buckets every mode by its requests; ``own`` gives a mode a ladder of its own
    (a token-bucketed mode: its buckets count query tokens, and ``select`` takes that count).
    ``pending``: keys captured on first use (:meth:`expect`); ``failed``: keys whose capture
    failed, with the reason their steps now run eagerly.
    """

    def __init__(self, policy: BucketPolicy, own: dict[Hashable, BucketPolicy] | None = None) -> None:
        self.policy = policy
        self.own: dict[Hashable, BucketPolicy] = dict(own or {})
        self.graphs: dict[tuple[Hashable, int], Graph] = {}
        self.pending: set[tuple[Hashable, int]] = set()
        self.failed: dict[tuple[Hashable, int], str] = {}
        self.replays: Counter[Hashable] = Counter()
        self.fallbacks: Counter[Fallback] = Counter()

    def policy_for(self, mode: Hashable) -> BucketPolicy:
        """The ladder ``mode`` is captured and dispatched by."""
        return self.own.get(mode, self.policy)

    def _check(self, mode: Hashable, bucket: int) -> None:
        buckets = self.policy_for(mode).buckets
        if bucket not in buckets:
            raise ValueError(f"bucket {bucket} is not in the policy {buckets}")

    def add(self, mode: Hashable, bucket: int, graph: Graph) -> None:
        """Register the graph of ``(mode, bucket)``; the bucket must be one of the mode's policy's."""
        self._check(mode, bucket)
        self.graphs[(mode, bucket)] = graph
        self.pending.discard((mode, bucket))

    def expect(self, mode: Hashable, bucket: int) -> None:
        """Mark ``(mode, bucket)`` pending: :meth:`select` answers :class:`Pending` until it is added."""
        self._check(mode, bucket)
        if (mode, bucket) not in self.graphs:
            self.pending.add((mode, bucket))
            self.failed.pop((mode, bucket), None)

    def fail(self, mode: Hashable, bucket: int, reason: str) -> None:
        """The capture of a pending key failed: its steps run eagerly, counted under ``reason``."""
        self.pending.discard((mode, bucket))
        self.failed[(mode, bucket)] = reason

    def replace(self, policy: BucketPolicy) -> None:
        """Drop every graph and dispatch by ``policy`` from now on (counters keep counting;
        modes with a ladder of their own keep it)."""
        self.clear()
        self.policy = policy

    def clear(self) -> None:
        """Drop every graph, pending key and failure (the policy and counters stay)."""
        self.graphs.clear()
        self.pending.clear()
        self.failed.clear()

    def captured_modes(self) -> set[Hashable]:
        """Every mode with at least one graph."""
        return {mode for mode, _ in self.graphs}

    def graphed_modes(self) -> set[Hashable]:
        """Every mode with at least one graph, captured or pending."""
        return self.captured_modes() | {mode for mode, _ in self.pending}

    def select(self, mode: Hashable, bs: int) -> tuple[int, Graph] | Pending | Fallback:
        """The bucket and graph for ``bs`` requests (tokens, for a mode with a ladder of its
        own), the pending key to capture first, or the reason there is none."""
        policy = self.own.get(mode)
        what = "bs" if policy is None else "tokens"
        policy = policy or self.policy
        bucket = policy.bucket_for(bs)
        if bucket is None:
            return Fallback(mode, f"{what} {bs} > largest bucket {policy.largest}")
        graph = self.graphs.get((mode, bucket))
        if graph is not None:
            return bucket, graph
        if (mode, bucket) in self.pending:
            return Pending(mode, bucket)
        failed = self.failed.get((mode, bucket))
        if failed is not None:
            return Fallback(mode, f"capture of {_name(mode)} {what}={bucket} failed: {failed}")
        return Fallback(mode, f"mode {_name(mode)} not captured")

    def count_fallback(self, fallback: Fallback) -> None:
        """Count one eager step taken for ``fallback``'s reason."""
        self.fallbacks[fallback] += 1

    def count_replay(self, mode: Hashable) -> None:
        """Count one replay of a ``mode`` graph."""
        self.replays[mode] += 1


def _name(mode: Hashable) -> str:
    return getattr(mode, "name", str(mode))

"""Graphs a ``(mode, bucket)`` key has beside its own: one store per kind of variant.

A key's own graph is the dispatcher's. A runtime may also capture, per key of a few modes, a
*variant* of it: the split pair of a runtime with token masks (:mod:`.split_pairs`), the lean
graph of a runtime whose sampler has extras (:mod:`.lean`). Each kind lives in a
:class:`Variants`: captured with its key (eager capture) or on the first step that asks for it
(lazy capture; on a key still pending, the variant alone: ``fastpath.Routes.alone``); a capture
that failed is kept as failed, with its reason, and such steps replay the key's own graph instead.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from graphrt.capture import GraphInfo
from graphrt.runtime.programs import SPLITS
from graphrt.step.config import RuntimeConfig
from graphrt.step.modes import ForwardMode

Key = tuple[ForwardMode, int]
#: The kinds of variant (:func:`variants_of`'s keys).
SPLIT, LEAN = "split", "lean"
#: Modes whose buckets get a lean graph (:mod:`.lean`): the steady state of serving.
LEAN_MODES = frozenset({ForwardMode.DECODE})
#: A variant's graph (a ``Graph``, or a ``SplitGraph`` of two) and its static output.
Made = tuple[Any, Any]


class Variants:
    """The variants of one kind by (mode, bucket); ``modes``: the modes that have them (empty:
    none is ever captured); ``instead``: what a step that asks for a failed one does instead."""

    def __init__(self, modes: frozenset[ForwardMode], instead: str) -> None:
        self.modes, self.instead = modes, instead
        self.made: dict[Key, Made] = {}
        #: Keys whose variant failed to capture (lazily), with the reason.
        self.failed: dict[Key, str] = {}
        #: Steps that replayed a variant, per mode, over the runtime's life (``RuntimeStats``).
        self.steps: Counter[ForwardMode] = Counter()

    def missing(self, keys: list[Key], skip: dict[Key, str]) -> list[Key]:
        """Keys of ``keys`` in one of :attr:`modes` without a variant (nor a failed one, nor in ``skip``)."""
        done = self.made.keys() | self.failed.keys() | skip.keys()
        return [k for k in keys if k[0] in self.modes and k not in done]

    def get(self, key: Key, capture: Callable[[], tuple[Made | None, str]]) -> Made | None:
        """The variant of ``key`` and its output; if missing, made now by ``capture()`` (a step's
        first use: what it made, or None and why, kept as failed). None where the mode has none
        or the key's capture failed."""
        found = self.made.get(key)
        if found is not None or key[0] not in self.modes or key in self.failed:
            return found
        made, why = capture()
        if made is None:
            self.failed[key] = why
        else:
            self.made[key] = made
        return made

    def infos(self) -> tuple[GraphInfo, ...]:
        """The facts of every captured graph (both parts of a split pair)."""
        return tuple(
            part.info for graph, _ in self.made.values() for part in getattr(graph, "parts", (graph,))
        )

    def clear(self) -> list[Any]:
        """Forget every variant and failure; returns the graphs (the caller frees them)."""
        graphs = [graph for graph, _ in self.made.values()]
        self.made.clear()
        self.failed.clear()
        return graphs


def variants_of(config: RuntimeConfig, lean: bool) -> dict[str, Variants]:
    """A runtime's variants by kind: split pairs in :data:`~.programs.SPLITS`' modes with token
    masks, lean graphs in :data:`LEAN_MODES` with sampler extras (``lean``)."""
    modes, split = config.capture_modes, config.token_masks and config.sample
    return {
        SPLIT: Variants(
            frozenset(m for m in modes if split and m in SPLITS),
            "its constrained steps replay the single graph",
        ),
        LEAN: Variants(
            frozenset(m for m in modes if lean and m in LEAN_MODES), "its lean steps replay the full graph"
        ),
    }

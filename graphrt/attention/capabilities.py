"""What an attention backend can serve, as data, and what a runtime asks of it.

A backend declares :class:`GraphSupport`; a runtime states its :class:`Needs` when it is built
(its capture modes and largest bucket, token trees, an FP8 cache, dense MLA's ``qv``, an encoder,
chunked-local layers). Support is opt-in: a backend that declares nothing serves nothing, and
a runtime it cannot serve is refused naming both (or, with no backend named, routed to the
first backend of its kind that can: :func:`graphrt.attention.registry.select_backend`).
"""

from __future__ import annotations

from dataclasses import dataclass

from graphrt.step.modes import ForwardMode

#: Every forward mode, for a backend whose kernels may be captured for any of them.
ALL_MODES: frozenset[ForwardMode] = frozenset(ForwardMode)
#: Every mode but MIXED (varlen queries of any length in a token-bucketed graph): for a backend
#: whose graphed kernels have not been held to the reference on mixed steps.
REQUEST_MODES: frozenset[ForwardMode] = ALL_MODES - {ForwardMode.MIXED}

#: The feature flags shared by :class:`GraphSupport` and :class:`Needs`, with what each means.
FEATURES: dict[str, str] = {
    "trees": "token trees (topk > 1: the cascade input)",
    "window": "sliding-window layers",
    "sinks": "attention sinks",
    "fp8_kv": "an FP8 KV cache",
    "qv": "dense MLA (qv)",
    "cross": "cross-attention (an encoder)",
    "chunked_local": "chunked-local layers",
}


@dataclass(frozen=True, slots=True)
class GraphSupport:
    """What a backend serves: the forward modes its kernels may be captured for (``modes``),
    buckets up to ``max_bucket`` (None: any), and each feature of :data:`FEATURES` it handles.
    Everything defaults to nothing: a backend opts in to what it really does."""

    modes: frozenset[ForwardMode] = frozenset()
    trees: bool = False
    window: bool = False
    sinks: bool = False
    fp8_kv: bool = False
    qv: bool = False
    cross: bool = False
    chunked_local: bool = False
    max_bucket: int | None = None

    def refusal(self, backend: str, needs: Needs) -> str | None:
        """Why ``backend`` cannot serve ``needs``, naming both, or None."""
        missing = [m.name for m in needs.modes if m not in self.modes]
        if missing:
            ok = ", ".join(sorted(m.name for m in self.modes)) or "none"
            return f"attention backend {backend!r} cannot be captured for {', '.join(missing)} (it supports {ok})"
        if self.max_bucket is not None and needs.largest > self.max_bucket:
            return f"attention backend {backend!r} is captured for buckets up to {self.max_bucket}, not {needs.largest}"
        lacking = [f for f in FEATURES if f in needs.features and not getattr(self, f)]
        if lacking:
            what = ", ".join(FEATURES[f] for f in lacking)
            return f"attention backend {backend!r} does not declare {what}, which {needs.model} uses"
        return None


@dataclass(frozen=True, slots=True)
class Needs:
    """What a runtime asks of its backend: ``modes`` captured up to bucket ``largest``, the
    ``features`` (names of :data:`FEATURES`) it uses, and ``model``, what a refusal calls it."""

    modes: tuple[ForwardMode, ...] = ()
    largest: int = 1
    features: frozenset[str] = frozenset()
    model: str = "the model"

    def __post_init__(self) -> None:
        unknown = sorted(self.features - FEATURES.keys())
        if unknown:
            raise ValueError(f"unknown attention features {unknown}; known: {', '.join(FEATURES)}")

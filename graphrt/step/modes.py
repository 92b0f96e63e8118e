"""Forward modes, speculative geometry, and what each mode is: tokens per request, graphed or not."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum


class ForwardMode(Enum):
    """What a step computes; ``MODES`` says per mode how many tokens and whether it is graphed."""

    DECODE = "decode"
    TARGET_VERIFY = "target_verify"
    DRAFT_DECODE = "draft_decode"
    DRAFT_EXTEND = "draft_extend"
    IDLE = "idle"
    EXTEND = "extend"
    MIXED = "mixed"

    # NOTE: members are singletons compared by identity, so the identity hash (C-level) is
    # correct; Enum's own hashes the name in Python, on every MODES lookup of the hot path.
    __hash__ = object.__hash__


@dataclass(frozen=True, slots=True)
class SpecGeometry:
    """EAGLE-style speculative geometry (docs/architecture.md vocabulary).

    Parameters
    ----------
    num_steps : int
        Draft tokens per branch. DRAFT_EXTEND yields the first, so DRAFT_DECODE runs
        ``num_steps - 1`` forward steps.
    topk : int
        Branches per request: 1 is a chain; ``> 1`` a tree (root plus ``topk`` chains).
    num_draft_tokens : int
        Query tokens per request in TARGET_VERIFY (the root plus the drafts kept). Default:
        every draft, ``1 + topk * num_steps``.
    """

    num_steps: int
    topk: int = 1
    num_draft_tokens: int = 0

    def __post_init__(self) -> None:
        if self.num_steps < 1 or self.topk < 1:
            raise ValueError(f"num_steps and topk must be >= 1, got {self.num_steps}, {self.topk}")
        full = 1 + self.topk * self.num_steps
        if self.num_draft_tokens == 0:
            object.__setattr__(self, "num_draft_tokens", full)
        if not 2 <= self.num_draft_tokens <= full:
            raise ValueError(
                f"num_draft_tokens {self.num_draft_tokens} must lie in [2, 1 + topk * num_steps = {full}]"
            )
        if self.topk == 1 and self.num_draft_tokens != full:
            raise ValueError(f"topk 1 is a chain: num_draft_tokens must be num_steps + 1 = {full}")

    @property
    def draft_forwards(self) -> int:
        """Forward steps inside one DRAFT_DECODE graph."""
        return self.num_steps - 1


Tokens = Callable[[SpecGeometry | None], int]


def _spec(field: str) -> Tokens:
    def tokens(spec: SpecGeometry | None) -> int:
        if spec is None:
            raise ValueError(f"this mode needs speculative geometry (RuntimeConfig.speculative) for {field}")
        return getattr(spec, field)

    return tokens


class TreeInput(Enum):
    """How a ``topk > 1`` token tree reaches a mode's cascade group."""

    NONE = "none"  # the mode never runs a tree
    MASK = "mask"  # host ``Batch.tree_mask`` (TARGET_VERIFY)
    DRAFT_SLOTS = "draft_slots"  # each branch's own draft slots, derived in the graph (DRAFT_DECODE)


@dataclass(frozen=True, slots=True)
class ModeSpec:
    """One row of the mode table: everything mode-specific, so no code branches on a mode.

    ``tokens`` gives the query tokens per request from the geometry: exact for uniform
    modes, the maximum for ``ragged`` ones. ``None``: any length (EXTEND, eager only).
    ``implicit_q_len``: a batch may omit ``q_lens`` (one token per request).
    ``draft_steps``: the step runs every draft step; ``out_cache_loc`` holds one slot per
    token per step, all branches of a request sit at position ``seq_len - 1`` and a pad row
    keeps a one-token prefix. ``tree``: where a ``topk > 1`` tree's expand lists come from.
    ``idle``: a step of this mode has no requests. ``samples``: with ``RuntimeConfig(sample=True)``
    the program samples one token per request from its last token's logits (the sampling group);
    TARGET_VERIFY one per verify node (speculative sampling). ``token_bucket``: the graph key's bucket counts query tokens, not requests
    (a mixed step: decode rows and prompt chunks); a bucket of ``T`` tokens holds up to
    ``min(T, max_batch_size)`` requests, pad requests have no query token and pad tokens belong
    to no request (docs/prefix-caching.md, "How a mixed step is laid out").
    """

    graphed: bool
    ragged: bool
    tokens: Tokens | None
    implicit_q_len: bool = False
    draft_steps: bool = False
    tree: TreeInput = TreeInput.NONE
    idle: bool = False
    samples: bool = False
    token_bucket: bool = False

    @property
    def last_rows_only(self) -> bool:
        """A sampling step's head computes each request's last token row only (the rows it
        samples from): a ragged mode that samples (a prompt's other rows need no logits)."""
        return self.ragged and self.samples


MODES: dict[ForwardMode, ModeSpec] = {
    ForwardMode.DECODE: ModeSpec(
        graphed=True, ragged=False, tokens=lambda _: 1, implicit_q_len=True, samples=True
    ),
    ForwardMode.TARGET_VERIFY: ModeSpec(
        graphed=True, ragged=False, tokens=_spec("num_draft_tokens"), tree=TreeInput.MASK, samples=True
    ),
    ForwardMode.DRAFT_DECODE: ModeSpec(
        graphed=True, ragged=False, tokens=_spec("topk"), draft_steps=True, tree=TreeInput.DRAFT_SLOTS
    ),
    ForwardMode.DRAFT_EXTEND: ModeSpec(graphed=True, ragged=True, tokens=_spec("num_draft_tokens")),
    ForwardMode.IDLE: ModeSpec(
        graphed=True, ragged=False, tokens=lambda _: 0, implicit_q_len=True, idle=True
    ),
    ForwardMode.EXTEND: ModeSpec(graphed=False, ragged=True, tokens=None, samples=True),
    # NOTE: a mixed step's rows decode or prefill a chunk; only decode rows and a prompt's
    # last chunk keep their token (the engine drops the others').
    ForwardMode.MIXED: ModeSpec(graphed=True, ragged=True, tokens=None, samples=True, token_bucket=True),
}


def tokens_per_req(mode: ForwardMode, spec: SpecGeometry | None) -> int | None:
    """Query tokens per request of ``mode`` (max for ragged modes; None: unbounded)."""
    tokens = MODES[mode].tokens
    return None if tokens is None else tokens(spec)


def rows_per_req(mode: ForwardMode, spec: SpecGeometry | None) -> int:
    """Token rows per request a graph of ``mode`` holds (>= 1: IDLE still has pad rows)."""
    return max(tokens_per_req(mode, spec) or 1, 1)

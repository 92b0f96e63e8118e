"""``Engine(speculative={...})``: the method, its geometry, and when speculation backs off."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from graphrt.step.modes import SpecGeometry

DRAFT_INITS = ("target", "seed", "checkpoint")
#: ``draft_model``: a draft model drafts (DRAFT_DECODE / DRAFT_EXTEND graphs); ``ngram``:
#: prompt lookup over the request's own tokens; ``suffix``: a suffix trie over them (trees).
METHODS = ("draft_model", "ngram", "suffix")
#: Options every method takes, and those of each method (``parse`` refuses the others).
COMMON = {"method", "num_steps", "topk", "num_draft_tokens"}
#: The options of the proposers (no forward pass), shared by ``ngram`` and ``suffix``.
PROPOSER = {
    "min_match",
    "max_match",
    "disable_batch_size",
    "min_acceptance",
    "backoff_rounds",
    "min_hit_rate",
}
OWN = {"draft_model": {"draft_model", "draft_seed", "draft_init"}, "ngram": PROPOSER, "suffix": PROPOSER}


@dataclass(frozen=True, slots=True)
class Backoff:
    """When a proposer-driven engine drafts nothing (rows then verify pad drafts, or the step
    is a plain DECODE when no row drafts).

    ``disable_batch_size``: no drafts in a step of more running requests (0: never off).
    ``min_acceptance``: a request whose acceptance (an average over its recent verifies, each
    the accepted share of the drafts it offered) falls below this pauses for
    ``backoff_rounds`` steps. ``min_hit_rate``: a request offers drafts only while the share of
    its proposer's recent guesses (offered or not) that its committed tokens matched is at
    least this (:mod:`graphrt.engine.gate`; 0: no gate).
    """

    disable_batch_size: int = 0
    min_acceptance: float = 0.2
    backoff_rounds: int = 4
    min_hit_rate: float = 0.6

    def __post_init__(self) -> None:
        if self.disable_batch_size < 0:
            raise ValueError(f"disable_batch_size must be >= 0 (0: never), got {self.disable_batch_size}")
        if not 0.0 <= self.min_acceptance <= 1.0:
            raise ValueError(f"min_acceptance must lie in [0, 1], got {self.min_acceptance}")
        if self.backoff_rounds < 1:
            raise ValueError(f"backoff_rounds must be >= 1, got {self.backoff_rounds}")
        if not 0.0 <= self.min_hit_rate <= 1.0:
            raise ValueError(f"min_hit_rate must lie in [0, 1], got {self.min_hit_rate}")


@dataclass(frozen=True, slots=True)
class SpecOptions:
    """``Engine(speculative={...})``, validated.

    ``method``: one of :data:`METHODS` (default ``"draft_model"``). ``geometry``: drafts per
    branch (``num_steps``), branches (``topk``, trees for ``draft_model`` and ``suffix``) and
    verify nodes. ``draft_init``: ``"target"`` copies the target's weights by name into a
    preset draft (early exit, or a copy for the same preset); ``"seed"``: the preset's random
    weights from ``draft_seed``; ``"checkpoint"``: the draft checkpoint's own weights. Default:
    ``"target"`` for a preset, ``"checkpoint"`` for a checkpoint (resolved by the draft
    builder). ``min_match`` / ``max_match``: the shortest and longest n-gram (``ngram``) or
    suffix (``suffix``) matched against the request's earlier tokens (a long match picks the
    right one of code's many repeated short runs; a 2-token match in prose guesses poorly). ``backoff``: see
    :class:`Backoff` (proposer methods only).
    """

    draft_model: str
    geometry: SpecGeometry
    draft_seed: int = 1
    draft_init: str | None = None
    method: str = "draft_model"
    min_match: int = 3
    max_match: int = 8
    backoff: Backoff = Backoff()

    @property
    def uses_draft_model(self) -> bool:
        return self.method == "draft_model"

    @classmethod
    def parse(cls, options: dict[str, Any]) -> SpecOptions:
        method = str(options.get("method", "draft_model"))
        if method not in METHODS:
            raise ValueError(f"speculative method must be one of {METHODS}, got {method!r}")
        known = COMMON | OWN[method]
        unknown = set(options) - known
        if unknown:
            raise ValueError(
                f"unknown speculative option(s) {sorted(unknown)} for method {method!r}; known: {sorted(known)}"
            )
        init = options.get("draft_init")
        if init is not None and init not in DRAFT_INITS:
            raise ValueError(f"draft_init must be one of {DRAFT_INITS}, got {init!r}")
        steps, topk = int(options.get("num_steps", 3)), int(options.get("topk", 1))
        if method == "ngram" and topk != 1:
            raise ValueError(f"the ngram method drafts a chain: topk must be 1, got {topk}")
        geometry = SpecGeometry(steps, topk, int(options.get("num_draft_tokens", 0)))
        lo, hi = int(options.get("min_match", 3)), int(options.get("max_match", 8))
        if not 1 <= lo <= hi:
            raise ValueError(f"need 1 <= min_match <= max_match, got min_match {lo}, max_match {hi}")
        backoff = Backoff(
            int(options.get("disable_batch_size", 0)),
            float(options.get("min_acceptance", 0.2)),
            int(options.get("backoff_rounds", 4)),
            float(options.get("min_hit_rate", 0.6)),
        )
        draft = str(options.get("draft_model", "tiny-llama-draft"))
        return cls(draft, geometry, int(options.get("draft_seed", 1)), init, method, lo, hi, backoff)


def parse_cli(text: str) -> dict[str, Any]:
    """``--speculative`` text: a method name (``ngram``), or ``key=value`` pairs split by commas
    (``method=suffix,num_steps=4,topk=2``); values are ints, floats or strings."""
    if "=" not in text:
        return {"method": text.strip()}
    out: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise ValueError(f"--speculative: expected key=value, got {part!r}")
        out[key.strip()] = _scalar(value.strip())
    return out


def _scalar(value: str) -> int | float | str:
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value

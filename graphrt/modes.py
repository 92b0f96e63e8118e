"""Forward modes and what each one is: query tokens per request, graphed or eager-only."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class ForwardMode(Enum):
    DECODE = "decode"
    TARGET_VERIFY = "target_verify"
    DRAFT_DECODE = "draft_decode"
    DRAFT_EXTEND = "draft_extend"
    IDLE = "idle"
    EXTEND = "extend"


@dataclass(frozen=True, slots=True)
class ModeSpec:
    """``tokens_per_req`` is fixed for uniform modes (None: ragged, eager only)."""

    graphed: bool
    implemented: bool
    tokens_per_req: int | None


MODES: dict[ForwardMode, ModeSpec] = {
    ForwardMode.DECODE: ModeSpec(graphed=True, implemented=True, tokens_per_req=1),
    ForwardMode.EXTEND: ModeSpec(graphed=False, implemented=True, tokens_per_req=None),
    ForwardMode.TARGET_VERIFY: ModeSpec(graphed=True, implemented=False, tokens_per_req=None),
    ForwardMode.DRAFT_DECODE: ModeSpec(graphed=True, implemented=False, tokens_per_req=None),
    ForwardMode.DRAFT_EXTEND: ModeSpec(graphed=True, implemented=False, tokens_per_req=None),
    ForwardMode.IDLE: ModeSpec(graphed=True, implemented=False, tokens_per_req=0),
}

"""What ``graphrt bench model`` compares a step against besides its own floor: published H100
decode-step times (issue 25's anchors) and the issue's targets.

Anchors are other systems' numbers, measured by their authors on an H100 at batch size 1 (not
rerun here), so a row gets its ratio to each only when it ran on an H100 too; elsewhere they are
listed without a ratio. Targets: the Llama-3.2-1B shape at bs 1 in µs, the 8B shape as a ratio
to the step's weight floor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Anchor:
    """One published step time: ``us`` per decode step (bs 1, bf16, H100) and where it is from."""

    name: str
    us: float
    source: str


NO_BUBBLES = "Hazy Research's 'No Bubbles' post, as cited in issue 25"
RERUN = "the msaroufim/megakernels-vs-cuda-graphs rerun, as cited in issue 25"
EIGHT_B = "as cited in issue 25 (Llama-3-8B, H100)"
ANCHORS: dict[tuple[str, int], tuple[Anchor, ...]] = {
    ("llama-3.2-1b", 1): (
        Anchor("megakernel", 972.8, NO_BUBBLES),
        Anchor("CUDA graphs + PDL", 979.5, RERUN),
        Anchor("SGLang", 1460.0, NO_BUBBLES),
        Anchor("vLLM", 2400.0, NO_BUBBLES),
    ),
    ("llama-3-8b", 1): (
        Anchor("FlashFormer", 5430.0, EIGHT_B),
        Anchor("gpt-fast", 5950.0, EIGHT_B),
        Anchor("SGLang", 7370.0, EIGHT_B),
    ),
}
#: ``(shape, bs) -> (kind, bound)``: ``"us"``: p50 µs at most; ``"floor"``: p50 / weight floor at most.
TARGETS: dict[tuple[str, int], tuple[str, float]] = {
    ("llama-3.2-1b", 1): ("us", 900.0),
    ("llama-3-8b", 1): ("floor", 1.08),
    ("llama-3-8b", 16): ("floor", 1.15),
    ("llama-3-8b", 64): ("floor", 1.35),
}
ANCHOR_GPU = "H100"


def compare(shape: str, bs: int, device_name: str, us: float, over_floor: float) -> dict[str, Any]:
    """``anchors`` (each with ``graphrt_over``: our p50 over theirs, None off an H100) and
    ``target`` (with ``met``) for one row; empty lists / None where the issue names none."""
    same_gpu = ANCHOR_GPU in device_name
    anchors = [
        {"name": a.name, "us": a.us, "source": a.source, "graphrt_over": us / a.us if same_gpu else None}
        for a in ANCHORS.get((shape, bs), ())
    ]
    target = TARGETS.get((shape, bs))
    if target is None:
        return {"anchors": anchors, "target": None}
    kind, bound = target
    value = us if kind == "us" else over_floor
    return {
        "anchors": anchors,
        "target": {"kind": kind, "bound": bound, "value": value, "met": value <= bound},
    }


def summary(row: dict[str, Any]) -> str:
    """``"1.36x megakernel, target ≤ 900 µs: missed"``-style text for the table (— if nothing)."""
    parts = [f"{a['graphrt_over']:.2f}x {a['name']}" for a in row.get("anchors", []) if a["graphrt_over"]]
    target = row.get("target")
    if target:
        bound = f"{target['bound']:.0f} µs" if target["kind"] == "us" else f"{target['bound']:.2f}x floor"
        parts.append(f"target ≤ {bound}: {'met' if target['met'] else 'missed'}")
    return ", ".join(parts) or "—"

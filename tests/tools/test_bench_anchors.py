"""`graphrt bench model`'s anchors and targets: ratios only on the GPU the anchors ran on."""

from __future__ import annotations

import pytest

from graphrt.tools.bench import anchors


def test_a_1b_row_on_an_h100_gets_each_anchor_ratio_and_the_900_us_target() -> None:
    out = anchors.compare("llama-3.2-1b", 1, "NVIDIA H100 80GB HBM3", 1323.3, 1.605)
    ratios = {a["name"]: a["graphrt_over"] for a in out["anchors"]}
    assert ratios["megakernel"] == pytest.approx(1323.3 / 972.8)
    assert ratios["CUDA graphs + PDL"] == pytest.approx(1323.3 / 979.5)
    assert out["target"] == {"kind": "us", "bound": 900.0, "value": 1323.3, "met": False}
    assert anchors.summary(out).endswith("target ≤ 900 µs: missed")


def test_8b_targets_are_floor_ratios_and_other_gpus_get_no_anchor_ratio() -> None:
    out = anchors.compare("llama-3-8b", 16, "NVIDIA H200", 7000.0, 1.14)
    assert out["anchors"] == [] and out["target"]["met"] is True
    out = anchors.compare("llama-3-8b", 1, "NVIDIA H200", 4795.0, 1.38)
    assert [a["graphrt_over"] for a in out["anchors"]] == [None, None, None]
    assert anchors.summary(out) == "target ≤ 1.08x floor: missed"
    assert anchors.compare("tiny-llama", 4, "cpu", 10.0, 2.0) == {"anchors": [], "target": None}

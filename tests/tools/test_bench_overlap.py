"""``graphrt bench overlap``: runs on the CPU (tokens compared, no device intervals), and its
interval arithmetic finds the idle time between replays on a synthetic device timeline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphrt.cli import main
from graphrt.tools.bench.device_ops import Op, kernel_breakdown, union_us
from graphrt.tools.bench.overlap import replay_gaps

GRAPH = ["update", "gemm", "attn", "sample"]


def timeline(steps: int, idle: list[float]) -> list[Op]:
    """Each step: upload (2 µs), feed (1 µs), the graph's 4 kernels (10 µs each, 0.5 µs apart),
    copy-back (2 µs) 0.5 µs after the last kernel; ``idle[i]`` µs of nothing before step
    ``i + 1``'s upload."""
    ops, t = [], 0.0
    for i in range(steps):
        ops += [Op("Memcpy HtoD", t, t + 2), Op("gather", t + 2, t + 3)]
        t += 3
        for name in GRAPH:
            ops.append(Op(name, t, t + 10))
            t += 10.5
        ops.append(Op("Memcpy DtoH", t, t + 2))
        t += 2 + (idle[i] if i < len(idle) else 0.0)
    return ops


def test_union_clips_and_merges() -> None:
    ops = [Op("a", 0, 4), Op("b", 2, 6), Op("c", 10, 12)]
    assert union_us(ops) == 8
    assert union_us(ops, 3, 11) == 4  # [3, 6) and [10, 11)


def test_replay_gaps_count_only_idle_time_between_replays() -> None:
    idle = [0.0, 7.0, 25.0]
    ops = timeline(4, idle)
    gaps = replay_gaps(ops, 4, GRAPH)
    # copy-back, upload and feed are busy, not gap; the 0.5 µs before the copy-back is idle
    assert gaps == pytest.approx([x + 0.5 for x in idle])
    assert replay_gaps(ops[:-1], 4, GRAPH) is None  # not periodic: no guess
    assert replay_gaps(ops, 4, ["nothing"]) is None


def test_bench_overlap_on_cpu(tmp_path: Path) -> None:
    args = ["bench", "overlap", "--device", "cpu", "--batch-sizes", "1,2", "--iters", "3", "--context", "5"]
    assert main([*args, "--out", str(tmp_path)]) == 0
    result = json.loads(next(tmp_path.glob("overlap_*.json")).read_text())
    assert {"timestamp", "git_commit", "args", "env"} <= set(result) and result["env"]["torch"]
    assert [r["bs"] for r in result["rows"]] == [1, 2]
    for row in result["rows"]:
        assert row["tokens_equal"] is True
        for key in ("off", "on"):
            assert row[key]["wall_us"] > 0 and row[key]["busy_us"] is None  # no device timeline


def test_bench_overlap_sampled_on_another_model(tmp_path: Path) -> None:
    args = ["bench", "overlap", "--device", "cpu", "--batch-sizes", "1", "--iters", "2", "--context", "4"]
    extra = ["--engine-model", "tiny-llama-swa", "--sampled", "--out", str(tmp_path)]
    assert main([*args, *extra]) == 0
    result = json.loads(next(tmp_path.glob("overlap_*.json")).read_text())
    assert result["model"] == "tiny-llama-swa" and result["sampling"].startswith("top_p=0.9")
    assert result["rows"][0]["tokens_equal"] is True


def test_kernel_breakdown_groups_by_family_per_step() -> None:
    ops = [
        Op("void at::native::k<int, 4>(float*)", 0.0, 2.0),
        Op("nvjet_gemm_64x8", 3.0, 13.0),
        Op("void at::native::k<float, 2>(int)", 13.0, 14.0),
        Op("nvjet_gemm_64x8", 20.0, 30.0),
    ]
    d = kernel_breakdown(ops, steps=2)
    assert d["busy_us"] == 11.5 and d["span_us"] == 15.0 and d["launches"] == 2.0
    assert [(k["kernel"], k["us"], k["launches"]) for k in d["kernels"]] == [
        ("nvjet_gemm_64x8", 10.0, 1.0),
        ("at::native::k", 1.5, 1.0),
    ]
    assert abs(d["idle_share"] - (1 - 11.5 / 15.0)) < 1e-12
    assert kernel_breakdown([], steps=3)["kernels"] == []

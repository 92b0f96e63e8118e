"""``graphrt bench buckets``: a trace's padded tokens before and after, JSON never overwritten."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphrt.capture import optimal_buckets
from graphrt.cli import main
from graphrt.tools.bench.buckets import generate_trace


def _trace(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_trace_file_before_and_after(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = _trace(tmp_path, ["3", '{"bs": 3, "t": 1}', "3", "", "5", "40"])
    args = ["bench", "buckets", "--trace", str(trace), "--max-batch-size", "32", "--max-graphs", "3"]
    assert main([*args, "--out", str(tmp_path / "out")]) == 0
    assert main([*args, "--out", str(tmp_path / "out")]) == 0
    files = sorted((tmp_path / "out").glob("buckets_*.json"))
    assert len(files) == 2  # NOTE: a second run never overwrites the first
    result = json.loads(files[0].read_text())
    assert {"timestamp", "git_commit", "args", "env"} <= set(result)
    assert result["trace"] == {
        "source": str(trace),
        "steps": 5,
        "real_tokens": 14,
        "eager_steps": 1,
        "distinct_sizes": 2,
    }
    default, suggested = result["ladders"]
    assert default["buckets"] == [1, 2, 4, 8, 12, 16, 24, 32] and default["padded_tokens"] == 3 * 1 + 3
    assert suggested["buckets"] == [3, 5, 32] and suggested["padded_tokens"] == 0
    assert result["saved_fraction"] == 1.0
    out = capsys.readouterr().out
    assert "suggested" in out and "3, 5, 32" in out


def test_generated_trace_uses_the_default_ladders_graph_count(tmp_path: Path) -> None:
    args = ["bench", "buckets", "--steps", "500", "--mean-bs", "20", "--max-batch-size", "64"]
    assert main([*args, "--out", str(tmp_path)]) == 0
    result = json.loads(next(tmp_path.glob("buckets_*.json")).read_text())
    default, suggested = result["ladders"]
    assert suggested["graphs"] <= default["graphs"] == result["max_graphs"]
    assert suggested["padded_tokens"] <= default["padded_tokens"]
    assert suggested["buckets"][-1] == 64


def test_generator_is_seeded_and_bounded() -> None:
    trace = generate_trace(2000, 30, 48, seed=1)
    assert trace == generate_trace(2000, 30, 48, seed=1)
    assert len(trace) == 2000 and min(trace) >= 1 and max(trace) <= 48
    weights: dict[int, int] = {}
    for bs in trace:
        weights[bs] = weights.get(bs, 0) + 1
    assert optimal_buckets(weights, 4, 48)[-1] == 48


@pytest.mark.parametrize(
    ("lines", "match"),
    [
        (["3", "abc"], "line 2: 'abc' is not a bs >= 1"),
        (["0"], "line 1: '0' is not a bs >= 1"),
        (['{"n": 3}'], "line 1"),
        (["", " "], "holds no batch sizes"),
        (["99"], "has no step of at most 8 requests"),
    ],
)
def test_bad_trace_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], lines: list[str], match: str
) -> None:
    trace = _trace(tmp_path, lines)
    code = main(["bench", "buckets", "--trace", str(trace), "--max-batch-size", "8", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and match in err and "--trace" in err and len(err.strip().splitlines()) == 1
    assert not list(tmp_path.glob("buckets_*.json"))


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--trace", "/nonexistent/t.jsonl"], "is not a file"),
        (["--max-graphs", "0"], "'0' is not a positive integer"),
        (["--mean-bs", "300"], "argument --mean-bs: 300 exceeds --max-batch-size 256"),
    ],
)
def test_bad_flags_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], match: str
) -> None:
    assert main(["bench", "buckets", *args, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert match in err and len(err.strip().splitlines()) == 1

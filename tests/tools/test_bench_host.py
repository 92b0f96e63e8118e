"""``graphrt bench host --smoke`` runs on the CPU and writes a JSON result (never overwriting)."""

from __future__ import annotations

import json
from pathlib import Path

from graphrt.cli import main


def test_bench_host_smoke(tmp_path: Path) -> None:
    args = ["bench", "host", "--smoke", "--modes", "decode", "--out", str(tmp_path)]
    assert main(args) == 0
    assert main(args) == 0
    files = sorted(tmp_path.glob("host_*.json"))
    assert len(files) == 2  # a second run never overwrites the first
    result = json.loads(files[0].read_text())
    assert {"timestamp", "git_commit", "args", "env"} <= set(result)
    row = result["rows"][0]
    for key in (
        "create",
        "run",
        "validate",
        "write_upload",
        "launch",
        "peer_prepare",
        "floor_copy",
        "floor_launch",
    ):
        assert row[key]["p50"] > 0


def test_bench_host_profile_smoke(tmp_path: Path, capsys) -> None:
    """``--profile`` times each phase of run() (replay stubbed) and writes no result file."""
    args = ["bench", "host", "--profile", "--profile-top", "3", "--smoke", "--modes", "decode,verify-chain"]
    assert main([*args, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for phase in (
        "run_rewrite",
        "validate",
        "kv_check",
        "write_upload",
        "kv_commit",
        "run - phases",
        "tottime",
    ):
        assert phase in out
    assert "verify-chain" in out and not list(tmp_path.glob("host_*.json"))


def test_bench_host_interleaves_the_contexts(tmp_path: Path, capsys) -> None:
    """Two ``--context-lens``: each DECODE batch size's run() is timed per context in turn and
    reported with the widest context's p50 over the narrowest's."""
    args = ["bench", "host", "--modes", "decode", "--batch-sizes", "1,2", "--page-sizes", "16"]
    args += ["--context-lens", "256,512", "--real-len", "40", "--iters", "5", "--out", str(tmp_path)]
    assert main(args) == 0
    result = json.loads(next(tmp_path.glob("host_*.json")).read_text())
    assert [(r["bs"], sorted(r["run"])) for r in result["contexts"]] == [
        (1, ["256", "512"]),
        (2, ["256", "512"]),
    ]
    for r in result["contexts"]:
        assert r["ratio"] == r["run"]["512"]["p50"] / r["run"]["256"]["p50"] > 0
    assert "samples interleaved" in capsys.readouterr().out

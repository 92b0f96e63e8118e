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

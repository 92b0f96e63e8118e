"""``graphrt inspect``: the snapshot's facts as tables, without Textual."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from graphrt.cli import main
from tests.support.snapshots import take


@pytest.fixture(scope="module")
def snap_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return take(tmp_path_factory.mktemp("inspect"), corrupt=True)[2]


def test_inspect_prints_every_view(snap_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(snap_path), "--width", "160"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    # graphs grid: three captured buckets with parity, and the bucket nothing fits
    grid = [ln for ln in lines if ln.startswith("│ DECODE │")]
    assert [ln.split("│")[2].strip() for ln in grid[:4]] == ["1", "2", "4", ">4"]
    assert "ok " in grid[0] and "yes" in grid[0] and grid[3].split("│")[8].strip() == "1"
    assert "DECODE bucket 4: " in out and "host scalars: cascade=False, max_seqlen_q=1" in out
    # the emulated graph is a chain of its recorded ops, none launched with PDL on the CPU
    title = next(ln for ln in lines if ln.startswith("DECODE bucket 4: "))
    nodes = int(title.split(" nodes, ")[0].rsplit(" ", 1)[1])
    assert f"{nodes} nodes, 0 programmatic edges of {nodes - 1}" in title
    header = next(ln for ln in lines if "┃ count ┃" in ln)
    assert [c.strip() for c in header.split("┃")[1:5]] == ["count", "time", "share", "PDL"]
    assert "index_put_" in out and "[max_bs+1]" in out and "const dummy_slot" in out
    assert "pad violations: ['cache_seqlens']" in out
    contents = next(ln for ln in lines if ln.startswith("│ cache_seqlens ") and "│ 3 " in ln)
    assert [c.strip() for c in contents.split("│")[1:6]] == ["cache_seqlens", "3", "0", "1", "3"]
    assert "bs 5 > largest bucket 4" in out and "launch time" in out
    assert sum(ln.rstrip().endswith("│ ok     │") for ln in lines) == 3
    assert "all 19 at their defaults" in out  # the switches the runtime was built with


def test_inspect_unknown_version(snap_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads(snap_path.read_text())
    data["version"] = 7
    bad = tmp_path / "v7.json"
    bad.write_text(json.dumps(data))
    assert main(["inspect", str(bad)]) == 2
    assert "snapshot version 7 is not supported" in capsys.readouterr().err.replace("\n", " ")


def test_inspect_and_snapshot_never_import_textual(snap_path: Path) -> None:
    # NOTE: the GPU box has no Textual; demo --snapshot and inspect must run there.
    code = (
        "import sys; from graphrt.cli import main; import graphrt.tools.cli.demo, graphrt.debug.snapshot; "
        f"assert main(['inspect', {str(snap_path)!r}]) == 0; "
        "assert not [m for m in sys.modules if m.startswith(('textual', 'graphrt.tools.inspection.tui'))]"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ.copy())
    assert res.returncode == 0, res.stderr

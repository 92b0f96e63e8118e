"""Snapshots record every buffer group and what each mode's graphs read; inspect prints them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from graphrt.cli import main
from graphrt.debug.snapshot import load_snapshot, take_snapshot
from graphrt.step.modes import SpecGeometry
from tests.runtime.test_spec_modes import setup_for


@pytest.fixture(scope="module")
def tree_snapshot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A topk-2 runtime (step, cascade and draft groups) with every spec mode captured."""
    setup = setup_for(torch.device("cpu"), SpecGeometry(num_steps=3, topk=2, num_draft_tokens=5))
    path = tmp_path_factory.mktemp("groups") / "snap.json"
    take_snapshot(setup.runtime, str(path))
    return path


def test_every_group_is_recorded(tree_snapshot: Path) -> None:
    snap = load_snapshot(tree_snapshot)
    assert [m.group for m in snap.groups] == ["step", "cascade", "draft"]
    assert snap.groups[0] == snap.memory
    cascade = snap.groups[1]
    assert [b.name for b in cascade.buffers][:2] == ["expand_table", "expand_seqlens"]
    assert cascade.total_bytes == sum(b.nbytes for b in cascade.buffers)
    assert snap.arrays["cascade.expand_table"].shape == tuple(cascade.buffers[0].size)
    assert snap.arrays["draft.draft_loc"].dtype.name == "int64"


def test_reads_cover_every_group_a_mode_uses(tree_snapshot: Path) -> None:
    snap = load_snapshot(tree_snapshot)
    modes = {g.mode for g in snap.graphs}
    assert modes == {"DECODE", "TARGET_VERIFY", "DRAFT_EXTEND", "IDLE", "DRAFT_DECODE"}
    reads = {g.mode: {r.name.partition(".")[0] for r in g.reads if "." in r.name} for g in snap.graphs}
    assert reads["DECODE"] == set() and reads["DRAFT_EXTEND"] == set()
    assert reads["TARGET_VERIFY"] == {"cascade"}
    assert reads["DRAFT_DECODE"] == {"cascade", "draft"}


def test_inspect_prints_every_group(tree_snapshot: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(tree_snapshot), "--width", "160", "--no-kernels"]) == 0
    out = capsys.readouterr().out
    assert "static buffers: cascade group" in out and "static buffers: draft group" in out
    assert "expand_table" in out and "draft_loc" in out


def test_inspect_damaged_snapshot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": 1, "graphs": [')
    assert main(["inspect", str(bad)]) == 2
    assert f"{bad}: not valid JSON" in capsys.readouterr().err.replace("\n", "")

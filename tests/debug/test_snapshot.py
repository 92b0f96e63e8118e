"""Snapshots: round trip, facts they record, version check; telemetry and parity behind them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from graphrt.debug.parity import _result, probe_sizes
from graphrt.debug.schema import Snapshot
from graphrt.debug.snapshot import SNAPSHOT_VERSION, SnapshotVersionError, load_snapshot, npz_path
from graphrt.runtime.telemetry import Telemetry
from graphrt.tools.inspection import report
from tests.support.snapshots import BUCKETS, LAST_BS, take
from tests.support.util import Setup


@pytest.fixture(scope="module")
def taken(tmp_path_factory: pytest.TempPathFactory) -> tuple[Setup, Snapshot, Path]:
    return take(tmp_path_factory.mktemp("snap"))


def test_round_trip(taken: tuple[Setup, Snapshot, Path]) -> None:
    setup, snap, path = taken
    loaded = load_snapshot(path)
    assert loaded == snap
    assert npz_path(path).exists() and loaded.version == SNAPSHOT_VERSION
    for name, tensor in setup.runtime.buffers.full.items():
        np.testing.assert_array_equal(loaded.arrays[name], tensor.numpy())
    assert int(loaded.arrays["_bucket"]) == 4 and int(loaded.arrays["_bs"]) == LAST_BS


def test_facts(taken: tuple[Setup, Snapshot, Path]) -> None:
    setup, snap, _ = taken
    assert sorted(g.bucket for g in snap.graphs) == list(BUCKETS)
    g4 = snap.graph("DECODE", 4)
    assert g4 is not None and g4.host_scalars == {"max_seqlen_q": 1, "page_size": 16, "cascade": False}
    assert {k.name for k in g4.kernels} >= {"index_put_", "mm", "embedding"}
    # emulated: a chain of the recorded ops, none asking for PDL on the CPU
    assert (g4.edges, g4.programmatic_edges) == (g4.num_nodes - 1, 0)
    assert not any(k.pdl for k in g4.kernels)
    view = setup.runtime.buffers.view(4, 1)
    assert {r.name: r.address for r in g4.reads} == {
        r.name: getattr(view, r.name).data_ptr() for r in g4.reads
    }
    assert {r.name: r.shape for r in g4.reads}["cu_seqlens_q"] == (5,)
    assert [(f.mode, f.reason, f.count) for f in snap.fallbacks] == [("DECODE", "bs 5 > largest bucket 4", 1)]
    assert snap.memory.total_bytes == setup.runtime.buffers.memory_report().total_bytes
    assert snap.contents.bucket == 4 and snap.contents.bs == LAST_BS and snap.contents.violations == ()
    assert snap.config["capture_modes"] == ["DECODE"]


def test_telemetry_records(taken: tuple[Setup, Snapshot, Path]) -> None:
    _, snap, _ = taken
    records = snap.telemetry.records
    # 1 replay + 1 fallback before the sweep, then one replay per bucket
    assert [(r.bs, r.bucket) for r in records] == [(2, 2), (5, None), (1, 1), (2, 2), (3, 4)]
    assert records[1].fallback == "bs 5 > largest bucket 4" and records[1].update_us == 0
    assert all(r.update_us > 0 and r.launch_us > 0 for r in records if r.bucket is not None)


def test_telemetry_ring_is_bounded() -> None:
    t = Telemetry(capacity=3)
    for i in range(5):
        t.fell_back("DECODE", i, "x")
    assert [r.bs for r in t.records] == [2, 3, 4] and t.steps["DECODE"] == 5
    assert t.last_replay() is None


def test_parity_sweep(taken: tuple[Setup, Snapshot, Path]) -> None:
    _, snap, _ = taken
    assert [(p.bucket, p.bs) for p in snap.parity] == probe_sizes(BUCKETS) == [(1, 1), (2, 2), (4, 3)]
    assert all(p.ok and p.max_diff < p.tol for p in snap.parity)


def test_parity_locates_first_difference() -> None:
    diff = np.zeros((3, 5))
    diff[2, 0], diff[1, 3] = 0.5, 0.2
    res = _result("DECODE", 4, 3, diff, tol=0.1)
    assert res.first_bad == (1, 3) and res.worst == (2, 0) and res.max_diff == 0.5 and not res.ok


def test_pad_violation_is_recorded_and_marked(tmp_path: Path) -> None:
    _, snap, path = take(tmp_path, corrupt=True)
    assert snap.contents.violations == ("cache_seqlens",)
    rows = report.buffer_contents(load_snapshot(path), "cache_seqlens", 4)
    assert rows is not None and rows.status == ("real", "real", "real", "pad!") and rows.broken == [3]


@pytest.mark.parametrize("version", [999, None])
def test_unknown_version_fails_clearly(
    taken: tuple[Setup, Snapshot, Path], tmp_path: Path, version: int | None
) -> None:
    data = json.loads(taken[2].read_text())
    data["version"] = version
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(SnapshotVersionError, match=rf"version {version!r} is not supported.*reads version 1"):
        load_snapshot(bad)


def test_launch_dims_split() -> None:
    from graphrt.capture.kernels import split_launch

    assert split_launch("6,{32,16},0") == ("6", "{32,16}", "0")
    assert split_launch("") == ("", "", "")


def test_files_from_before_programmatic_edges_still_load() -> None:
    """The H100 snapshot in docs/ predates ``pdl`` and ``edges``: they read as unknown."""
    snap = load_snapshot(Path(__file__).parents[2] / "docs" / "snapshot-h100-fa3.json")
    assert snap.graphs and all(g.edges is None and g.programmatic_edges is None for g in snap.graphs)
    assert not any(k.pdl for g in snap.graphs for k in g.kernels)
    assert report.pdl_summary(snap.graphs[0]).startswith("programmatic edges not read")

"""A damaged snapshot fails with one SnapshotError naming the file and what is wrong."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from graphrt.debug.snapshot import SnapshotError, SnapshotVersionError, load_snapshot, npz_path
from tests.support.snapshots import take


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return take(tmp_path_factory.mktemp("snap"))[2]


@pytest.fixture
def copy(original: Path, tmp_path: Path) -> Path:
    """A fresh copy of the snapshot (JSON and .npz) that a test may damage."""
    path = tmp_path / "copy.json"
    shutil.copy(original, path)
    shutil.copy(npz_path(original), npz_path(path))
    return path


def edited(path: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    return path


def _drop(*keys: str | int) -> Callable[[dict[str, Any]], None]:
    def edit(data: dict[str, Any]) -> None:
        for k in keys[:-1]:
            data = data[k]
        del data[keys[-1]]

    return edit


def _set(value: Any, *keys: str | int) -> Callable[[dict[str, Any]], None]:
    def edit(data: dict[str, Any]) -> None:
        for k in keys[:-1]:
            data = data[k]
        data[keys[-1]] = value

    return edit


#: name -> (edit of the JSON data, message)
FIELD_CASES = {
    "missing_top_level": (_drop("graphs"), r"snapshot\.graphs: missing field"),
    "missing_nested": (_drop("memory", "group"), r"snapshot\.memory\.group: missing field"),
    "missing_in_list": (_drop("graphs", 0, "kernels"), r"snapshot\.graphs\[0\]\.kernels: missing field"),
    "int_as_string": (
        _set("four", "graphs", 0, "bucket"),
        r"snapshot\.graphs\[0\]\.bucket: expected an integer, got 'four'",
    ),
    "bool_as_int": (
        _set(True, "graphs", 0, "replays"),
        r"snapshot\.graphs\[0\]\.replays: expected an integer, got True",
    ),
    "list_as_object": (_set([], "replays"), r"snapshot\.replays: expected an object, got \[\]"),
    "object_as_list": (_set({}, "graphs"), r"snapshot\.graphs: expected a list, got \{\}"),
    "dict_value_type": (
        _set({"DECODE": "many"}, "replays"),
        r"snapshot\.replays\.DECODE: expected an integer",
    ),
    "number_as_string": (
        _set("fast", "parity", 0, "max_diff"),
        r"snapshot\.parity\[0\]\.max_diff: expected a number",
    ),
    "optional_wrong": (
        _set("x", "contents", "bucket"),
        r"snapshot\.contents\.bucket: expected an integer, got 'x'",
    ),
    "pair_too_long": (
        _set([1, 2, 3], "parity", 0, "worst"),
        r"snapshot\.parity\[0\]\.worst: expected a list of 2, got \[1, 2, 3\]",
    ),
}


@pytest.mark.parametrize("case", list(FIELD_CASES))
def test_schema_mismatch(copy: Path, case: str) -> None:
    edit, message = FIELD_CASES[case]
    with pytest.raises(SnapshotError, match=rf"^{copy}: {message}"):
        load_snapshot(edited(copy, edit))


def test_truncated_json(copy: Path) -> None:
    text = copy.read_text()
    copy.write_text(text[: len(text) // 2])
    with pytest.raises(
        SnapshotError, match=rf"^{copy}: not valid JSON at line \d+ column \d+: .*truncated\?"
    ):
        load_snapshot(copy)


def test_json_not_an_object(copy: Path) -> None:
    copy.write_text("[1, 2]")
    with pytest.raises(SnapshotError, match=rf"^{copy}: a snapshot is a JSON object, got list"):
        load_snapshot(copy)


def test_binary_garbage(copy: Path) -> None:
    copy.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(SnapshotError, match=rf"^{copy}: "):
        load_snapshot(copy)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.json"
    with pytest.raises(SnapshotError, match=rf"^{path}: cannot read the snapshot"):
        load_snapshot(path)


@pytest.mark.parametrize("cut", [0.5, 0.9])
def test_truncated_npz(copy: Path, cut: float) -> None:
    npz = npz_path(copy)
    data = npz.read_bytes()
    npz.write_bytes(data[: int(len(data) * cut)])
    with pytest.raises(SnapshotError, match=rf"^{npz}: damaged \.npz"):
        load_snapshot(copy)


def test_npz_not_a_zip(copy: Path) -> None:
    npz_path(copy).write_bytes(b"not a zip at all")
    with pytest.raises(SnapshotError, match=rf"^{npz_path(copy)}: damaged \.npz"):
        load_snapshot(copy)


def test_version_error_is_a_snapshot_error(copy: Path) -> None:
    with pytest.raises(SnapshotError, match=r"version 7 is not supported") as info:
        load_snapshot(edited(copy, _set(7, "version")))
    assert isinstance(info.value, SnapshotVersionError)


def test_intact_copy_loads(copy: Path, original: Path) -> None:
    assert load_snapshot(copy) == load_snapshot(original)

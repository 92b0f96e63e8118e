"""Issue 24.6: a damaged snapshot is one :class:`SnapshotError` naming the file, whatever the damage.

200 randomly damaged copies (the JSON cut short, a field swapped for an impossible value,
nesting 50 to 100,000 levels deep, garbage; or the ``.npz`` damaged), then the two cases of
the issue by name: JSON nested 100,000 levels deep, and a file larger than a snapshot can be,
through ``load_snapshot`` and ``graphrt inspect`` (one line, exit 2).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from graphrt.cli import main
from graphrt.debug import reader
from graphrt.debug.snapshot import SnapshotError, load_snapshot, npz_path
from tests.support.fuzz_util import damaged, damaged_json, outcomes
from tests.support.snapshots import take

COPIES = 200


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return take(tmp_path_factory.mktemp("snap"))[2]


def test_damaged_snapshot(original: Path, tmp_path: Path) -> None:
    text, arrays = original.read_text(), npz_path(original).read_bytes()

    def make(i: int, rng: np.random.Generator) -> Path:
        path = tmp_path / f"snap{i}.json"
        if rng.random() < 0.7:
            path.write_text(damaged_json(text, rng))
            npz_path(path).write_bytes(arrays)
        else:
            path.write_text(text)
            npz_path(path).write_bytes(damaged(arrays, 512, rng))
        return path

    def read(path: Path) -> object:
        try:
            return load_snapshot(path)
        except SnapshotError as err:  # NOTE: a damaged .npz is named as such, beside its JSON
            raise SnapshotError(str(err).replace(str(npz_path(path)), f"{path} (.npz)")) from err

    seen = outcomes(COPIES, make, read, SnapshotError, seed=4)
    assert seen["refused"] > COPIES // 2, seen


def test_deeply_nested_snapshot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "deep.json"
    path.write_text('{"version": 1, "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(SnapshotError, match=r"deep\.json: JSON nested too deeply to be a snapshot"):
        load_snapshot(path)
    assert main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nested too deeply" in err and "Traceback" not in err, err


def test_oversized_snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reader, "MAX_JSON_BYTES", 1000)
    path = tmp_path / "big.json"
    path.write_text(json.dumps({"version": 1, "pad": "x" * 2000}))
    with pytest.raises(SnapshotError, match=r"big\.json: \d+ bytes is larger than a snapshot's facts can be"):
        load_snapshot(path)

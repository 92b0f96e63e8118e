"""Reading snapshots back: JSON facts checked against the schema, arrays from the ``.npz``.

Whatever is wrong with a file (unreadable, truncated, oversized or too deeply nested JSON, a
missing field, a field of the wrong type, a damaged ``.npz``) raises one :class:`SnapshotError`
naming the file and the field; a snapshot of another schema version raises
:class:`SnapshotVersionError`.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any

import numpy as np

from graphrt.debug.schema import Snapshot

#: Bumped on any change a version-1 reader would misread (renamed, retyped or removed fields).
SNAPSHOT_VERSION = 1
#: Largest snapshot JSON read: its facts (graphs, kernels, buffer metadata), not buffer contents.
MAX_JSON_BYTES = 256 << 20


class SnapshotError(ValueError):
    """A snapshot file (JSON or ``.npz``) that cannot be read; the message names the file."""


class SnapshotVersionError(SnapshotError):
    """The snapshot was written with a schema version this graphrt cannot read."""


class _Mismatch(Exception):
    """A field that does not match the schema (``where``: its dotted path)."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")


def npz_path(path: str | Path) -> Path:
    """Where the buffer contents of the snapshot at ``path`` live (same stem, ``.npz``)."""
    return Path(path).with_suffix(".npz")


def load_snapshot(path: str | Path) -> Snapshot:
    """Read a snapshot written by ``save_snapshot`` (or ``GraphRuntime.snapshot``).

    Raises
    ------
    SnapshotVersionError
        The file's ``version`` is not :data:`SNAPSHOT_VERSION`.
    SnapshotError
        The JSON or the ``.npz`` is unreadable, truncated, or does not match the schema.
    """
    path = Path(path)
    data = _read_json(path)
    found = data.get("version")
    if found != SNAPSHOT_VERSION:
        raise SnapshotVersionError(
            f"{path}: snapshot version {found!r} is not supported; this graphrt reads version "
            f"{SNAPSHOT_VERSION}. Take a new snapshot (graphrt demo --snapshot PATH) or open it "
            "with the graphrt release that wrote it."
        )
    facts = {k: v for k, v in data.items() if k != "arrays"}
    try:
        snapshot = _build(Snapshot, facts, "snapshot")
    except _Mismatch as exc:
        raise SnapshotError(f"{path}: {exc}") from None
    except RecursionError:  # NOTE: a value nested almost as deep as json allows, shown in a message
        raise SnapshotError(f"{path}: JSON nested too deeply to be a snapshot") from None
    return dataclasses.replace(snapshot, arrays=_read_npz(npz_path(path)))


def _read_json(path: Path) -> dict[str, Any]:
    try:
        size = path.stat().st_size
        if size > MAX_JSON_BYTES:
            raise SnapshotError(
                f"{path}: {size} bytes is larger than a snapshot's facts can be "
                f"(limit {MAX_JSON_BYTES} bytes; buffer contents live in the .npz)"
            )
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise SnapshotError(f"{path}: cannot read the snapshot: {exc}") from None
    try:
        data = json.loads(text)
    except RecursionError:
        # NOTE: the schema nests a few levels; json recurses once per level of the input
        raise SnapshotError(f"{path}: JSON nested too deeply to be a snapshot") from None
    except json.JSONDecodeError as exc:
        end = " (near the end of the file: truncated?)" if len(text.rstrip()) - exc.pos < 40 else ""
        raise SnapshotError(
            f"{path}: not valid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}{end}"
        ) from None
    if not isinstance(data, dict):
        raise SnapshotError(f"{path}: a snapshot is a JSON object, got {type(data).__name__}")
    return data


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    if not path.exists():
        return {}
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {k: npz[k] for k in npz.files}
    except Exception as exc:  # NOTE: zipfile, zlib and numpy raise a dozen kinds for damage
        raise SnapshotError(f"{path}: damaged .npz (buffer contents): {type(exc).__name__}: {exc}") from None


_PLAIN = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def _build(tp: Any, value: Any, where: str) -> Any:
    """``value`` (JSON data) as schema type ``tp``; raises :class:`_Mismatch` naming ``where``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        return _build_union(args, value, where)
    if origin is tuple:
        return _build_tuple(args, value, where)
    if origin is dict:
        _expect(isinstance(value, dict), "an object", value, where)
        return {k: _build(args[1], v, f"{where}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return _build_dataclass(tp, value, where)
    if tp in _PLAIN:
        ok = isinstance(value, tp) and (tp is bool or not isinstance(value, bool))
        ok = ok or (tp is float and isinstance(value, int) and not isinstance(value, bool))
        _expect(ok, _PLAIN[tp], value, where)
    return value


def _build_union(args: tuple, value: Any, where: str) -> Any:
    if value is None and type(None) in args:
        return None
    options = [a for a in args if a is not type(None)]
    if len(options) == 1 and value is not None:
        return _build(options[0], value, where)  # NOTE: keeps the precise message
    for arg in options:
        try:
            return _build(arg, value, where)
        except _Mismatch:
            continue
    names = " or ".join(_name(a) for a in args)
    raise _Mismatch(where, f"expected {names}, got {value!r}")


def _name(tp: Any) -> str:
    if tp is type(None):
        return "null"
    if typing.get_origin(tp) is tuple:
        return "a list"
    return _PLAIN.get(tp, getattr(tp, "__name__", str(tp)))


def _build_tuple(args: tuple, value: Any, where: str) -> tuple:
    _expect(isinstance(value, list), "a list", value, where)
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(_build(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
    _expect(len(value) == len(args), f"a list of {len(args)}", value, where)
    return tuple(_build(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True)))


def _build_dataclass(tp: Any, value: Any, where: str) -> Any:
    _expect(isinstance(value, dict), "an object", value, where)
    hints = typing.get_type_hints(tp)
    fields = [f for f in dataclasses.fields(tp) if f.init]
    for f in fields:
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if required and f.name not in value:
            raise _Mismatch(f"{where}.{f.name}", "missing field")
    return tp(
        **{
            f.name: _build(hints[f.name], value[f.name], f"{where}.{f.name}")
            for f in fields
            if f.name in value
        }
    )


def _expect(ok: bool, what: str, value: Any, where: str) -> None:
    if not ok:
        shown = repr(value) if len(repr(value)) <= 60 else f"{type(value).__name__}"
        raise _Mismatch(where, f"expected {what}, got {shown}")

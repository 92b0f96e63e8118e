"""A :class:`~graphrt.kernels.tuning.table.TuningTable` as a JSON file, and back.

The file holds every tunable (``skinny_rules``, ``skinny_overrides``, ``prologue_norm_tile``,
``prologue_tiles``, ``decode_warps``, ``decode_merge_tile``, ``decode_waves``,
``sampler_layouts``, ``moe``, ``moe_skinny_slots``), the ``device`` it was made for, its
``format`` (:data:`FORMAT`) and ``source``: per tunable group, where the values came from. A
missing, unknown or ill-typed field is refused with a ``ValueError`` naming the file and the
field (``skinny_rules[0].tile.block_n``); nothing is guessed or filled in.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from graphrt.kernels.tuning.table import MoeTiles, SamplerRule, ShapeTile, SkinnyRule, Tile, TuningTable

#: Bumped when the file's fields change; a file of another format is refused.
FORMAT = 1
#: ``max_k`` of a rule that takes any ``K`` (written as ``null``).
ANY_K = 1 << 62


class TableError(ValueError):
    """A tuning table file that cannot be read: names the file and the field."""


def _int(raw: Any, where: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise TableError(f"{where}: expected an integer, got {raw!r}")
    return raw


def _record(cls: type, raw: Any, where: str) -> Any:
    """A frozen record of ints and nested records (``Tile``) from a JSON object, every field named."""
    if not isinstance(raw, dict):
        raise TableError(f"{where}: expected an object with {[f.name for f in dataclasses.fields(cls)]}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(raw) - set(names))
    if unknown:
        raise TableError(f"{where}: unknown field {', '.join(unknown)} (fields: {', '.join(names)})")
    values = {}
    for f in dataclasses.fields(cls):
        if f.name not in raw:
            if f.default is dataclasses.MISSING:
                raise TableError(f"{where}.{f.name}: missing")
            continue
        value = raw[f.name]
        if f.name == "max_k" and value is None:
            value = ANY_K
        nested = hints[f.name]
        parse = _int if nested is int else lambda r, w, c=nested: _record(c, r, w)
        values[f.name] = parse(value, f"{where}.{f.name}")
    try:
        return cls(**values)
    except ValueError as e:
        raise TableError(f"{where}: {e}") from None


def _list(cls: type) -> Callable[[Any, str], tuple]:
    def parse(raw: Any, where: str) -> tuple:
        if not isinstance(raw, list):
            raise TableError(f"{where}: expected a list, got {raw!r}")
        return tuple(_record(cls, item, f"{where}[{i}]") for i, item in enumerate(raw))

    return parse


def _tile_or_none(raw: Any, where: str) -> Tile | None:
    return None if raw is None else _record(Tile, raw, where)


def _warps(raw: Any, where: str) -> tuple[tuple[int, int], ...]:
    if not isinstance(raw, dict) or not all(isinstance(k, str) and k.isdigit() for k in raw):
        raise TableError(f"{where}: expected an object head dim -> warps, got {raw!r}")
    return tuple(sorted((int(d), _int(w, f"{where}.{d}")) for d, w in raw.items()))


def _source(raw: Any, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
        raise TableError(f"{where}: expected an object tunable group -> where its values came from")
    return tuple(raw.items())


#: Field of the file -> its parser ``(raw, where) -> value`` (the table's fields, in order).
PARSERS: dict[str, Callable[[Any, str], Any]] = {
    "source": _source,
    "skinny_rules": _list(SkinnyRule),
    "skinny_overrides": _list(ShapeTile),
    "prologue_norm_tile": _tile_or_none,
    "prologue_tiles": _list(ShapeTile),
    "decode_warps": _warps,
    "decode_merge_tile": _int,
    "decode_waves": _int,
    "sampler_layouts": _list(SamplerRule),
    "moe": lambda raw, where: _record(MoeTiles, raw, where),
    "moe_skinny_slots": _int,
}


def parse(raw: Any, name: str, path: str) -> TuningTable:
    """The table of a decoded JSON document ``raw`` (``path`` names it in every error)."""
    if not isinstance(raw, dict):
        raise TableError(f"tuning table {path}: expected a JSON object")
    if raw.get("format") != FORMAT:
        raise TableError(
            f"tuning table {path}: field format is {raw.get('format')!r}; this graphrt reads {FORMAT}"
        )
    known = {"format", "device", *PARSERS}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise TableError(f"tuning table {path}: unknown field {', '.join(unknown)}")
    values = {}
    for field, parse_one in PARSERS.items():
        if field not in raw:
            raise TableError(f"tuning table {path}: field {field} is missing")
        values[field] = parse_one(raw[field], f"tuning table {path}: field {field}")
    try:
        return TuningTable(name=name, path=path, **values)
    except ValueError as e:
        raise TableError(f"tuning table {path}: {e}") from None


def load(path: Path, name: str) -> TuningTable:
    """The table in JSON file ``path`` (``TableError`` naming the file and the field)."""
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise TableError(f"tuning table {path}: not JSON ({e})") from None
    return parse(raw, name, str(path))


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def as_json(table: TuningTable, device: str) -> dict[str, Any]:
    """The file's JSON object for ``table``, made on ``device`` (:func:`parse` reads it back)."""
    out: dict[str, Any] = {"format": FORMAT, "device": device}
    for field in PARSERS:
        out[field] = _plain(getattr(table, field))
    out["source"] = dict(table.source)
    out["decode_warps"] = {str(d): w for d, w in table.decode_warps}
    for rule in out["skinny_rules"]:
        rule["max_k"] = None if rule["max_k"] >= ANY_K else rule["max_k"]
    return out


def write(table: TuningTable, device: str, path: Path) -> Path:
    """Write ``table`` to ``path`` (parent folders made), through a temporary file and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(as_json(table, device), indent=1) + "\n")
    tmp.replace(path)
    return path

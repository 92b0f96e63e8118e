"""Which :class:`~graphrt.kernels.tuning.table.TuningTable` a process runs with.

Building a runtime calls :func:`install` once with its device: the table is chosen then, read
from disk then, and kept as the process's active table (:func:`active`), which the kernels'
launch helpers read instead of module constants. Nothing on the replay path (nor any eager
call) reads a file or the environment. The choice, first found wins:

1. the user cache ``$XDG_CACHE_HOME/graphrt/tuning/<key>.json`` (``~/.cache`` without
   ``XDG_CACHE_HOME``), written by ``graphrt tune``; skipped when ``GRAPHRT_CACHE=0`` (the same
   switch as the converted-weights cache);
2. the committed table ``graphrt/kernels/tables/<key>.json`` (the H100 and the H200);
3. :data:`~graphrt.kernels.tuning.table.DEFAULT` (any other GPU, and the CPU).

``<key>`` is the device name with every run of other characters than letters and digits made
one ``_``: ``NVIDIA H100 80GB HBM3`` -> ``NVIDIA_H100_80GB_HBM3``. A file that exists but cannot
be read is refused (naming the file and the field), never skipped.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path

import torch

from graphrt.kernels import switches
from graphrt.kernels.tuning import files
from graphrt.kernels.tuning.table import DEFAULT, TuningTable

#: The committed tables, one per device key.
COMMITTED = Path(__file__).resolve().parent.parent / "tables"


def device_key(name: str) -> str:
    """The file name (without ``.json``) of device ``name``'s table."""
    key = re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_")
    if not key:
        raise ValueError(f"device name {name!r} has no letters or digits to key a tuning table by")
    return key


def device_name(device: torch.device) -> str | None:
    """``torch.cuda.get_device_name`` of a CUDA ``device``; None for any other device."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else None


def cache_dir() -> Path | None:
    """``graphrt/tuning`` under the cache root (:func:`graphrt.kernels.switches.cache_root`);
    None when ``GRAPHRT_CACHE=0`` or no home is known."""
    root = switches.cache_root()
    return None if root is None else root / "tuning"


def cache_path(name: str) -> Path | None:
    """Where ``graphrt tune`` writes device ``name``'s table (None: no cache)."""
    root = cache_dir()
    return None if root is None else root / f"{device_key(name)}.json"


def candidates(name: str | None) -> list[Path]:
    """The files tried for device ``name``, first found wins (none for the CPU)."""
    if name is None:
        return []
    cached = cache_path(name)
    committed = COMMITTED / f"{device_key(name)}.json"
    return [p for p in (cached, committed) if p is not None]


def choose(name: str | None) -> TuningTable:
    """The table of device ``name`` (None: the CPU): the cache, the committed table, or DEFAULT."""
    for path in candidates(name):
        if path.is_file():
            return files.load(path, device_key(name or ""))
    return DEFAULT


_active: list[TuningTable] = [DEFAULT]  # NOTE: the process's one table, as switches keeps its record


def active() -> TuningTable:
    """The table the kernels launch with: :data:`DEFAULT` until :func:`install` sets one."""
    return _active[0]


def install(table: TuningTable) -> TuningTable:
    """Make ``table`` the process's active table (building a runtime does, through :func:`install_for`)."""
    _active[0] = table
    return table


def install_for(device: torch.device) -> TuningTable:
    """Choose ``device``'s table (:func:`choose`) and make it the active one."""
    return install(choose(device_name(device)))


@contextlib.contextmanager
def using(table: TuningTable) -> Iterator[TuningTable]:
    """Run the enclosed code with ``table`` active, then restore the previous one (tests, ``tune``)."""
    before = _active[0]
    _active[0] = table
    try:
        yield table
    finally:
        _active[0] = before

"""Versioned debug snapshots: JSON for the facts, ``.npz`` beside it for buffer contents.

The schema is the dataclasses of ``graphrt.debug.schema`` (``Snapshot`` at the top); docs/snapshot.md describes it
field by field. A reader refuses any ``version`` other than :data:`SNAPSHOT_VERSION`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import types
import typing
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from graphrt.buffers import StaticBuffers
from graphrt.capture import GraphInfo
from graphrt.capture.kernels import split_launch
from graphrt.debug.parity import ParityResult
from graphrt.debug.schema import (
    BufferFacts,
    BufferRead,
    ContentsFacts,
    FallbackFacts,
    GraphFacts,
    KernelFacts,
    MemoryFacts,
    Snapshot,
    TelemetryFacts,
)
from graphrt.step.modes import ForwardMode

if TYPE_CHECKING:
    from graphrt.runtime import GraphRuntime

log = logging.getLogger(__name__)

#: Bumped on any change a version-1 reader would misread (renamed, retyped or removed fields).
SNAPSHOT_VERSION = 1


class SnapshotVersionError(ValueError):
    """The snapshot was written with a schema version this graphrt cannot read."""


__all__ = [
    "SNAPSHOT_VERSION",
    "BufferFacts",
    "BufferRead",
    "ContentsFacts",
    "FallbackFacts",
    "GraphFacts",
    "KernelFacts",
    "MemoryFacts",
    "Snapshot",
    "SnapshotVersionError",
    "TelemetryFacts",
    "load_snapshot",
    "npz_path",
    "save_snapshot",
    "take_snapshot",
]


def npz_path(path: str | Path) -> Path:
    """Where the buffer contents of the snapshot at ``path`` live (same stem, ``.npz``)."""
    return Path(path).with_suffix(".npz")


def save_snapshot(snapshot: Snapshot, path: str | Path) -> None:
    """Write ``snapshot`` as JSON at ``path`` and its arrays beside it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    facts = {f.name: getattr(snapshot, f.name) for f in dataclasses.fields(snapshot) if f.name != "arrays"}
    data = {k: _plain(v) for k, v in facts.items()}
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")
    np.savez_compressed(npz_path(path), **snapshot.arrays)


def load_snapshot(path: str | Path) -> Snapshot:
    """Read a snapshot written by :func:`save_snapshot` (or ``GraphRuntime.snapshot``).

    Raises
    ------
    SnapshotVersionError
        The file's ``version`` is not :data:`SNAPSHOT_VERSION`.
    """
    path = Path(path)
    data = json.loads(path.read_text())
    found = data.get("version") if isinstance(data, dict) else None
    if found != SNAPSHOT_VERSION:
        raise SnapshotVersionError(
            f"{path}: snapshot version {found!r} is not supported; this graphrt reads version "
            f"{SNAPSHOT_VERSION}. Take a new snapshot (graphrt demo --snapshot PATH) or open it "
            "with the graphrt release that wrote it."
        )
    arrays: dict[str, np.ndarray] = {}
    if npz_path(path).exists():
        with np.load(npz_path(path)) as npz:
            arrays = {k: npz[k] for k in npz.files}
    return _build(Snapshot, {**data, "arrays": arrays})


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _build(tp: Any, value: Any) -> Any:
    """Rebuild ``tp`` (a schema dataclass, tuple, optional or plain type) from JSON data."""
    if value is None:
        return None
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _build(inner[0], value) if len(inner) == 1 else value
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_build(args[0], v) for v in value)
        return tuple(_build(a, v) for a, v in zip(args, value, strict=True))
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        return tp(
            **{
                f.name: _build(hints[f.name], value[f.name])
                for f in dataclasses.fields(tp)
                if f.name in value
            }
        )
    return value


# ---- taking a snapshot ---------------------------------------------------------------------
def take_snapshot(
    runtime: GraphRuntime,
    path: str | Path,
    *,
    environment: dict[str, Any] | None = None,
    parity: tuple[ParityResult, ...] = (),
    bucket: int | None = None,
    bs: int | None = None,
) -> Snapshot:
    """Write the runtime's facts to ``path`` (JSON) and its buffer contents beside it (``.npz``).

    Parameters
    ----------
    runtime : GraphRuntime
    path : str or Path
    environment : dict, optional
        Device and library versions (``graphrt.tools.env.environment``); default: torch only.
    parity : tuple of ParityResult
        Results of :func:`graphrt.debug.check_parity` / ``parity_sweep`` to include.
    bucket, bs : int, optional
        The step the buffer contents are described as; default: the last replay.

    Copies buffers to the host (a device sync): call it between steps, never inside one.
    """
    contents = _contents(runtime, bucket, bs, npz_path(path).name)
    snapshot = Snapshot(
        version=SNAPSHOT_VERSION,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        environment=environment or {"device": str(runtime.device), "torch": torch.__version__},
        engine=runtime.engine.name,
        backend=runtime.backend.name,
        config={
            f.name: _config_value(getattr(runtime.config, f.name)) for f in dataclasses.fields(runtime.config)
        },
        graphs=tuple(_graph_facts(runtime, key, g.info) for key, g in runtime.dispatcher.graphs.items()),
        fallbacks=tuple(
            FallbackFacts(_name(fb.mode), fb.reason, n) for fb, n in runtime.dispatcher.fallbacks.items()
        ),
        replays=runtime.stats().replays,
        eager=runtime.stats().eager,
        memory=_memory(runtime.buffers),
        contents=contents,
        telemetry=TelemetryFacts(
            runtime.telemetry.capacity,
            runtime.telemetry.sync,
            dict(runtime.telemetry.steps),
            tuple(runtime.telemetry.records),
        ),
        parity=tuple(parity),
        arrays=_arrays(runtime.buffers, contents),
    )
    save_snapshot(snapshot, path)
    log.info("snapshot of %d graphs written to %s (+ %s)", len(snapshot.graphs), path, npz_path(path).name)
    return snapshot


def _name(mode: Any) -> str:
    return getattr(mode, "name", str(mode))


def _config_value(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_config_value(v) for v in value]
    return _name(value) if isinstance(value, ForwardMode) else value


def _graph_facts(runtime: GraphRuntime, key: tuple[Any, int], info: GraphInfo) -> GraphFacts:
    mode, bucket = key
    tpr = runtime.rows_per_req(mode)
    view = runtime.buffers.view(bucket, tpr)
    reads = tuple(
        BufferRead(s.name, tuple(t.shape), str(t.dtype).removeprefix("torch."), t.data_ptr())
        for s in runtime.buffers.specs
        for t in [getattr(view, s.name)]
    )
    kernels = tuple(
        KernelFacts(k.name, k.count, *split_launch(k.launch), time_us=k.time_us)
        if k.launch
        else KernelFacts(k.name, k.count, time_us=k.time_us)
        for k in info.kernels
    )
    return GraphFacts(
        _name(mode),
        bucket,
        tpr,
        info.capture_seconds * 1e3,
        info.pool_bytes,
        info.num_nodes,
        info.replays,
        kernels,
        dict(info.host_scalars),
        reads,
    )


def _memory(buffers: StaticBuffers) -> MemoryFacts:
    report, base = buffers.memory_report(), buffers.arena.data_ptr()
    rows = tuple(
        BufferFacts(
            s.name,
            tuple(s.shape),
            tuple(buffers.full[s.name].shape),
            str(s.dtype).removeprefix("torch."),
            s.pad.kind,
            s.pad.value,
            s.host,
            s.nbytes(buffers.dims),
            buffers.full[s.name].data_ptr() - base,
            buffers.full[s.name].data_ptr(),
        )
        for s in buffers.specs
    )
    return MemoryFacts(report.family, report.arena_bytes, report.host_arena_bytes, report.total_bytes, rows)


def _contents(runtime: GraphRuntime, bucket: int | None, bs: int | None, file: str) -> ContentsFacts:
    last = runtime.telemetry.last_replay()
    mode = ForwardMode[last.mode] if last else next(iter(runtime.config.capture_modes), ForwardMode.DECODE)
    bucket = bucket if bucket is not None else (last.bucket if last else None)
    bs = bs if bs is not None else (last.bs if last else 0)
    tpr = runtime.rows_per_req(mode)
    pad = runtime.pad_values(mode)
    violations = runtime.buffers.pad_violations(bucket, tpr, bs, pad) if bucket else []
    return ContentsFacts(file, mode.name, bucket, bs, tpr, pad, tuple(violations))


def _arrays(buffers: StaticBuffers, contents: ContentsFacts) -> dict[str, np.ndarray]:
    # NOTE: full-size copies: a bucket's view is a prefix of each, so any bucket can be shown.
    arrays = {name: t.detach().cpu().numpy() for name, t in buffers.full.items()}
    arrays["_bucket"] = np.array(contents.bucket if contents.bucket is not None else -1)
    arrays["_bs"] = np.array(contents.bs)
    return arrays

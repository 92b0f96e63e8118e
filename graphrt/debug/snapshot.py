"""Versioned debug snapshots: JSON for the facts, ``.npz`` beside it for buffer contents.

The schema is the dataclasses of ``graphrt.debug.schema`` (``Snapshot`` at the top); docs/snapshot.md describes it
field by field. :mod:`graphrt.debug.reader` reads them back and refuses any ``version``
other than :data:`SNAPSHOT_VERSION` and any damaged file (:class:`SnapshotError`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from graphrt.buffers import StaticBuffers
from graphrt.capture import GraphInfo
from graphrt.capture.kernels import split_launch
from graphrt.debug.parity import ParityResult
from graphrt.debug.reader import (
    SNAPSHOT_VERSION,
    SnapshotError,
    SnapshotVersionError,
    load_snapshot,
    npz_path,
)
from graphrt.debug.schema import (
    BufferFacts,
    BufferRead,
    ContentsFacts,
    FallbackFacts,
    GraphFacts,
    KernelFacts,
    KVFacts,
    MemoryFacts,
    PendingFacts,
    Snapshot,
    TelemetryFacts,
)
from graphrt.kv import PagedKVCache
from graphrt.step.modes import MODES, ForwardMode

if TYPE_CHECKING:
    from graphrt.runtime import GraphRuntime

__all__ = [
    "SNAPSHOT_VERSION",
    "BufferFacts",
    "BufferRead",
    "ContentsFacts",
    "FallbackFacts",
    "GraphFacts",
    "KVFacts",
    "KernelFacts",
    "MemoryFacts",
    "PendingFacts",
    "Snapshot",
    "SnapshotError",
    "SnapshotVersionError",
    "TelemetryFacts",
    "load_snapshot",
    "npz_path",
    "save_snapshot",
    "take_snapshot",
]

log = logging.getLogger(__name__)


def save_snapshot(snapshot: Snapshot, path: str | Path) -> None:
    """Write ``snapshot`` as JSON at ``path`` and its arrays beside it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    facts = {f.name: getattr(snapshot, f.name) for f in dataclasses.fields(snapshot) if f.name != "arrays"}
    data = {k: _plain(v) for k, v in facts.items()}
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")
    np.savez_compressed(npz_path(path), **snapshot.arrays)


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
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
    speculation: dict[str, Any] | None = None,
) -> Snapshot:
    """Write the runtime's facts to ``path`` (JSON) and its buffer contents beside it (``.npz``).

    Parameters
    ----------
    runtime : GraphRuntime
    path : str or Path
    environment : dict, optional
        Device and library versions (``graphrt.tools.cli.env.environment``); default: torch only.
    parity : tuple of ParityResult
        Results of :func:`graphrt.debug.check_parity` / ``parity_sweep`` to include.
    bucket, bs : int, optional
        The step the buffer contents are described as; default: the last replay.
    speculation : dict, optional
        ``Engine.stats().speculation()``: the engine's speculative counters.
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
        # NOTE: the report's graphs: each (mode, bucket)'s, then each split pair's two parts
        graphs=tuple(_graph_facts(runtime, info.key, info) for info in runtime.report().graphs),
        fallbacks=tuple(
            FallbackFacts(_name(fb.mode), fb.reason, n) for fb, n in runtime.dispatcher.fallbacks.items()
        ),
        replays=runtime.stats().replays,
        eager=runtime.stats().eager,
        memory=_memory(runtime.buffers),
        contents=contents,
        telemetry=_telemetry(runtime.telemetry),
        parity=tuple(parity),
        groups=tuple(_memory(f) for f in _groups(runtime)),
        kv=_kv(runtime.kv),
        switches=runtime.switches.as_dict(),
        speculation=dict(speculation or {}),
        pending=tuple(PendingFacts(_name(m), b) for m, b in runtime.report().pending),
        tuning=runtime.tuning.brief(),
        arrays=_arrays(runtime, contents),
    )
    save_snapshot(snapshot, path)
    log.info("snapshot of %d graphs written to %s (+ %s)", len(snapshot.graphs), path, npz_path(path).name)
    return snapshot


def _telemetry(telemetry: Any) -> TelemetryFacts:
    return TelemetryFacts(telemetry.capacity, telemetry.sync, dict(telemetry.steps), tuple(telemetry.records))


def _kv(kv: Any) -> KVFacts | None:
    """What the KV cache holds and takes (an MHA/GQA cache; None for an MLA cache)."""
    if not isinstance(kv, PagedKVCache):
        return None
    scales = [() if t is None else tuple(t.tolist()) for t in (kv.k_scale, kv.v_scale)]
    dtype = str(kv.dtype).removeprefix("torch.")
    return KVFacts(dtype, kv.nbytes, kv.bytes_per_token, kv.shape.num_pages, kv.page_size, *scales)


def _name(mode: Any) -> str:
    return getattr(mode, "name", str(mode))


def _config_value(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_config_value(v) for v in value]
    return _name(value) if isinstance(value, ForwardMode) else value


def _graph_facts(runtime: GraphRuntime, key: tuple[Any, ...], info: GraphInfo) -> GraphFacts:
    """``key``: ``(mode, bucket)``, or a split pair's part ``(mode, bucket, part)``, named
    ``"MODE.part"`` (e.g. ``DECODE.forward``, ``DECODE.sampler``; graphrt/runtime/split_pairs.py)."""
    mode, bucket, *part = key
    rows_per_req = runtime.rows_per_req(mode)
    shape = runtime.capturer.shape(mode, bucket)  # NOTE: a MIXED bucket counts tokens, not rows
    reads = tuple(
        BufferRead(_key(group, s.name), tuple(t.shape), str(t.dtype).removeprefix("torch."), t.data_ptr())
        for group in _groups(runtime, mode)
        for view in [group.view(shape.rows, rows_per_req, shape.tokens)]
        for s in group.specs
        for t in [getattr(view, s.name)]
    )
    kernels = tuple(
        KernelFacts(k.name, k.count, *split_launch(k.launch), time_us=k.time_us, pdl=k.pdl > 0)
        if k.launch
        else KernelFacts(k.name, k.count, time_us=k.time_us, pdl=k.pdl > 0)
        for k in info.kernels
    )
    topology = info.topology
    return GraphFacts(
        ".".join([_name(mode), *part]),
        bucket,
        rows_per_req,
        info.capture_seconds * 1e3,
        info.pool_bytes,
        info.num_nodes,
        info.replays,
        kernels,
        dict(info.host_scalars),
        reads,
        edges=None if topology is None else topology.edges,
        programmatic_edges=info.programmatic_edges,
    )


def _groups(runtime: GraphRuntime, mode: ForwardMode | None = None) -> list[StaticBuffers]:
    """Every buffer group of ``runtime`` (step first, sampling left out), or those a graph of
    ``mode`` reads."""
    groups = runtime.groups
    if mode is not None:
        return list(groups.used_by(mode))
    return [g for name, g in groups.groups.items() if name != "sampling"]


def _key(group: StaticBuffers, name: str) -> str:
    """A buffer's name in reads and arrays: bare for ``step``, ``group.name`` otherwise."""
    return name if group.group == "step" else f"{group.group}.{name}"


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
    return MemoryFacts(report.group, report.arena_bytes, report.host_arena_bytes, report.total_bytes, rows)


def _contents(runtime: GraphRuntime, bucket: int | None, bs: int | None, file: str) -> ContentsFacts:
    last = runtime.telemetry.last_replay()
    mode = ForwardMode[last.mode] if last else next(iter(runtime.config.capture_modes), ForwardMode.DECODE)
    bucket = bucket if bucket is not None else (last.bucket if last else None)
    bs = bs if bs is not None else (last.bs if last else 0)
    rows_per_req = runtime.rows_per_req(mode)
    pad = runtime.pad_values(mode)
    # NOTE: the last replay's token count is not recorded, and a MIXED bucket's pad tokens start
    # there: its pad rows are checked by debug mode's poison instead (docs/prefix-caching.md).
    checked = bucket and not MODES[mode].token_bucket
    violations = runtime.buffers.pad_violations(bucket, rows_per_req, bs, pad) if checked else []
    return ContentsFacts(file, mode.name, bucket, bs, rows_per_req, pad, tuple(violations))


def _arrays(runtime: GraphRuntime, contents: ContentsFacts) -> dict[str, np.ndarray]:
    # NOTE: full-size copies: a bucket's view is a prefix of each, so any bucket can be shown.
    arrays = {
        _key(group, name): _host_copy(t) for group in _groups(runtime) for name, t in group.full.items()
    }
    arrays["_bucket"] = np.array(contents.bucket if contents.bucket is not None else -1)
    arrays["_bs"] = np.array(contents.bs)
    return arrays


def _host_copy(t: torch.Tensor) -> np.ndarray:
    """A numpy copy; bf16 as float32, other dtypes numpy lacks (fp8) as raw bytes."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.float().numpy()
    try:
        return t.numpy()
    except TypeError:
        return t.contiguous().view(torch.uint8).numpy()

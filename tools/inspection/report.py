"""Rows of text from a snapshot, shared by ``graphrt inspect`` (rich) and ``graphrt debug`` (Textual).

Nothing here imports Textual: the GPU box runs ``inspect`` without it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from graphrt.debug.snapshot import GraphFacts, KVFacts, MemoryFacts, Snapshot
from graphrt.kernels import switches

# NOTE: re-exported: inspect and the TUI read every kind of row from this module
from graphrt.tools.inspection.buffer_contents import BufferRows as BufferRows
from graphrt.tools.inspection.buffer_contents import buffer_contents as buffer_contents
from graphrt.tools.inspection.kernel_table import KERNEL_COLUMNS as KERNEL_COLUMNS
from graphrt.tools.inspection.kernel_table import fmt_time as fmt_time
from graphrt.tools.inspection.kernel_table import kernel_rows as kernel_rows
from graphrt.tools.inspection.kernel_table import pdl_summary as pdl_summary

Row = tuple[str, ...]

GRAPH_COLUMNS = (
    "mode",
    "bucket",
    "captured",
    "capture ms",
    "pool MiB",
    "nodes",
    "replays",
    "fallbacks",
    "parity",
)
READ_COLUMNS = ("buffer", "shape", "dtype", "address")
BUFFER_COLUMNS = ("buffer", "declared", "size", "dtype", "pad rule", "written", "bytes", "offset", "address")
PARITY_COLUMNS = (
    "mode",
    "bucket",
    "bs",
    "max |diff|",
    "tol",
    "first > tol (token, col)",
    "worst at",
    "status",
)
FALLBACK_COLUMNS = ("mode", "reason", "count")
RECENT_COLUMNS = ("#", "mode", "bs", "bucket", "update", "launch", "replay", "fallback")


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f}"


def parity_status(snap: Snapshot, mode: str, bucket: int) -> str:
    """``ok <max diff>``, ``FAIL <max diff> @ (token, col)`` or ``-`` (not checked)."""
    res = next((p for p in snap.parity if p.mode == mode and p.bucket == bucket), None)
    if res is None:
        return "-"
    if res.first_bad is None:
        return f"ok {res.max_diff:.1e}"
    return f"FAIL {res.max_diff:.1e} @ {res.first_bad}"


def _fallbacks_by_bucket(snap: Snapshot) -> dict[tuple[str, int | None], int]:
    """Fallback steps in the telemetry ring per (mode, bucket they would fit; None: none fits)."""
    buckets = sorted({g.bucket for g in snap.graphs})
    out: dict[tuple[str, int | None], int] = {}
    for r in snap.telemetry.records:
        if r.fallback is not None:
            fit = next((b for b in buckets if b >= r.bs), None)
            out[(r.mode, fit)] = out.get((r.mode, fit), 0) + 1
    return out


def graph_rows(snap: Snapshot) -> list[Row]:
    """The mode × bucket grid: one row per captured, pending (lazy capture: no step has needed
    it yet) or fallen-back (mode, bucket)."""
    pending = {(p.mode, p.bucket) for p in snap.pending}
    buckets = sorted({g.bucket for g in snap.graphs} | {b for _, b in pending})
    fallbacks = _fallbacks_by_bucket(snap)
    modes = sorted({g.mode for g in snap.graphs} | {f.mode for f in snap.fallbacks} | {m for m, _ in pending})
    rows: list[Row] = []
    for mode in modes:
        for bucket in buckets:
            g = snap.graph(mode, bucket)
            fb = str(fallbacks.get((mode, bucket), 0))
            if g is None:
                state = "pending" if (mode, bucket) in pending else "no"
                rows.append((mode, str(bucket), state, "-", "-", "-", "-", fb, "-"))
                continue
            rows.append(
                (
                    mode,
                    str(bucket),
                    "yes",
                    f"{g.capture_ms:.1f}",
                    _mib(g.pool_bytes),
                    str(g.num_nodes),
                    str(g.replays),
                    fb,
                    parity_status(snap, mode, bucket),
                )
            )
        if fallbacks.get((mode, None)):
            big = f">{buckets[-1]}" if buckets else "any"
            rows.append((mode, big, "no", "-", "-", "-", "-", str(fallbacks[(mode, None)]), "-"))
    return rows


def host_scalar_rows(graph: GraphFacts) -> list[Row]:
    """``(name, repr(value))`` of every host scalar frozen into ``graph``, by name."""
    return [(k, repr(v)) for k, v in sorted(graph.host_scalars.items())]


def read_rows(graph: GraphFacts) -> list[Row]:
    """The static-buffer views ``graph`` reads: name, shape, dtype, captured address."""
    return [(r.name, "×".join(map(str, r.shape)), r.dtype, f"0x{r.address:x}") for r in graph.reads]


def buffer_rows(snap: Snapshot) -> list[Row]:
    """Every declared static buffer of the step group: shape, size, dtype, pad rule, where written, bytes, address."""
    return memory_rows(snap.memory)


def memory_rows(memory: MemoryFacts) -> list[Row]:
    """One row per declared buffer of a group."""
    return [
        (
            b.name,
            "[" + ", ".join(map(str, b.shape)) + "]",
            "×".join(map(str, b.size)),
            b.dtype,
            f"{b.pad_kind} {b.pad_value}" if b.pad_kind != "free" else "free",
            "host" if b.host else "device",
            str(b.nbytes),
            str(b.offset),
            f"0x{b.address:x}",
        )
        for b in memory.buffers
    ]


# ---- replays and parity ----------------------------------------------------------------------
def percentiles(values: Sequence[float]) -> str:
    """``p50 … p90 … p99 … max …`` of µs values, units scaled; ``-`` when empty."""
    if not values:
        return "-"
    p50, p90, p99 = np.percentile(np.asarray(values), [50, 90, 99])
    return "  ".join(
        f"{k} {fmt_time(float(v))}"
        for k, v in (("p50", p50), ("p90", p90), ("p99", p99), ("max", max(values)))
    )


def replay_summary(snap: Snapshot) -> list[Row]:
    """Steps recorded, replays vs fallbacks, and update / launch (/ synced replay) percentiles."""
    replays = [r for r in snap.telemetry.records if r.bucket is not None]
    synced = [r.replay_us for r in replays if r.replay_us is not None]
    rows = [
        ("steps recorded", f"{len(snap.telemetry.records)} (ring of {snap.telemetry.capacity})"),
        ("replays / fallbacks", f"{len(replays)} / {len(snap.telemetry.records) - len(replays)}"),
        ("update", percentiles([r.update_us for r in replays])),
        ("launch", percentiles([r.launch_us for r in replays])),
    ]
    if synced:
        rows.append(("replay (synced)", percentiles(synced)))
    return rows + speculation_rows(snap)


def speculation_rows(snap: Snapshot) -> list[Row]:
    """The engine's speculation (acceptance, tokens per round, back-off), when it speculates."""
    spec = snap.speculation
    if not spec:
        return []
    backoff = (
        "decode_steps",
        "batch_steps",
        "paused_rows",
        "no_match_rows",
        "pad_rows",
        "pauses",
        "stale_rows",
    )
    return [
        ("speculation", f"overlapped {spec.get('overlapped')}, {spec.get('verify_steps')} verifies"),
        ("acceptance", f"{spec.get('acceptance_rate')} ({spec.get('drafts_accepted')} of {spec.get('drafts_proposed')} drafts)"),
        ("tokens per round", f"{spec.get('tokens_per_round')} (mean accepted length {spec.get('mean_accept_length')})"),
        ("back-off", f"{spec.get('paused_requests')} paused now; " + ", ".join(f"{k} {spec[k]}" for k in backoff if k in spec)),
    ]  # fmt: skip


def histogram(values: Sequence[float], bins: int = 8, width: int = 30) -> list[str]:
    """Text histogram of µs values, one line per bin: ``lo – hi  ████  count`` (units scaled)."""
    if not values:
        return ["(no replays recorded)"]
    counts, edges = np.histogram(np.asarray(values), bins=bins)
    top = max(int(counts.max()), 1)
    return [
        f"{fmt_time(float(edges[i])):>9} – {fmt_time(float(edges[i + 1])):<9} {'█' * round(width * c / top):<{width}} {c}"
        for i, c in enumerate(counts)
    ]


def recent_rows(snap: Snapshot, n: int = 50) -> list[Row]:
    """The last ``n`` steps of the telemetry ring, oldest first."""
    records = list(snap.telemetry.records)[-n:]
    first = len(snap.telemetry.records) - len(records)
    return [
        (
            str(first + i),
            r.mode,
            str(r.bs),
            "-" if r.bucket is None else str(r.bucket),
            fmt_time(r.update_us),
            fmt_time(r.launch_us),
            fmt_time(r.replay_us),
            r.fallback or "",
        )
        for i, r in enumerate(records)
    ]


def fallback_rows(snap: Snapshot) -> list[Row]:
    """Eager fallbacks: mode, reason, count."""
    return [(f.mode, f.reason, str(f.count)) for f in snap.fallbacks]


def parity_rows(snap: Snapshot) -> list[Row]:
    """Graph-vs-eager parity per mode and bucket, sorted."""
    return [
        (
            p.mode,
            str(p.bucket),
            str(p.bs),
            f"{p.max_diff:.3g}",
            f"{p.tol:g}",
            "-" if p.first_bad is None else str(tuple(p.first_bad)),
            "-" if p.worst is None else str(tuple(p.worst)),
            "ok" if p.first_bad is None else "FAIL",
        )
        for p in sorted(snap.parity, key=lambda p: (p.mode, p.bucket))
    ]


def header_rows(snap: Snapshot) -> list[Row]:
    """Snapshot version and time, device and versions, engine / backend, config, buffer bytes."""
    env = snap.environment
    cfg = snap.config
    return [
        ("snapshot", f"version {snap.version}, {snap.created}"),
        ("device", f"{env.get('device')} (torch {env.get('torch')}, sgl-kernel {env.get('sgl_kernel')})"),
        ("engine / backend", f"{snap.engine} / {snap.backend}"),
        ("config", ", ".join(f"{k}={v}" for k, v in cfg.items())),
        ("switches", switches_line(snap.switches)),
        ("tuning table", tuning_line(snap.tuning)),
        ("static buffers", f"{snap.memory.total_bytes} B declared, arena {snap.memory.arena_bytes} B"),
        *([("KV cache", kv_line(snap.kv))] if snap.kv is not None else []),
    ]


def switches_line(values: dict[str, str]) -> str:
    """The switches that differ from their default (docs/switches.md), or that none does."""
    if not values:
        return "not recorded (a snapshot from before the switch table)"
    default = switches.read({}).as_dict()
    changed = [f"{k}={v}" for k, v in values.items() if default.get(k) != v]
    return ", ".join(changed) if changed else f"all {len(values)} at their defaults"


def tuning_line(table: dict[str, str]) -> str:
    """The kernels' tuning table: its name and the file it was read from."""
    if not table:
        return "not recorded (a snapshot from before the tuning tables)"
    return f"{table['name']} ({table['path']})"


def kv_line(kv: KVFacts) -> str:
    """The KV cache in one line: dtype, bytes, bytes per token, pages, an FP8 cache's scales."""
    k, v = kv.k_scale, kv.v_scale
    scales = f"; k_scale {min(k):g}..{max(k):g}, v_scale {min(v):g}..{max(v):g}" if k else ""
    size = f"{kv.nbytes / 2**20:.1f} MiB ({kv.bytes_per_token} B/token, {kv.num_pages} pages)"
    return f"{kv.dtype}, {size}{scales}"

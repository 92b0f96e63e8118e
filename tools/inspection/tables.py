"""``graphrt inspect PATH``: a snapshot's facts as rich tables on stdout (for logs and CI)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from graphrt.debug.snapshot import GraphFacts, Snapshot, SnapshotError, load_snapshot
from graphrt.tools.cli.args import UsageError
from graphrt.tools.cli.console import wide_console
from graphrt.tools.inspection import report


def _table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> Table:
    table = Table(title=title, title_justify="left", show_header=True, header_style="bold")
    for col in columns:
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))  # NOTE: "[max_bs]" is data, not markup
    return table


def _graph_detail(graph: GraphFacts, console: Console, full_names: bool = False) -> None:
    timed = sum(k.time_us or 0.0 for k in graph.kernels)
    title = (
        f"{graph.mode} bucket {graph.bucket}: {len({k.name for k in graph.kernels})} kernels, "
        f"{graph.num_nodes} nodes, {report.pdl_summary(graph)}"
        + (f", {report.fmt_time(timed)} of kernel time per replay" if timed else "")
    )
    table = _table(title, report.KERNEL_COLUMNS, report.kernel_rows(graph, full_names))
    scalars = ", ".join(f"{k}={v}" for k, v in report.host_scalar_rows(graph)) or "none"
    table.caption, table.caption_justify = f"host scalars: {scalars}", "left"
    console.print(table)


def _detail_graphs(snap: Snapshot, every: bool) -> list[GraphFacts]:
    """Every graph, or the largest bucket of each mode (the others differ in launch dims only)."""
    graphs = sorted(snap.graphs, key=lambda g: (g.mode, g.bucket))
    if every:
        return graphs
    return [g for g in graphs if g.bucket == max(h.bucket for h in graphs if h.mode == g.mode)]


def _contents(snap: Snapshot, console: Console) -> None:
    c = snap.contents
    if c.bucket is None or not snap.arrays:
        console.print("[dim]buffer contents: none (no replay before the snapshot, or .npz missing)[/]")
        return
    rows = []
    for b in snap.memory.buffers:
        shown = report.buffer_contents(snap, b.name, c.bucket)
        if shown is None:
            continue
        count = {s: shown.status.count(s) for s in ("real", "pad", "pad!")}
        first_bad = str(shown.broken[0]) if shown.broken else "-"
        rows.append((b.name, str(count["real"]), str(count["pad"]), str(count["pad!"]), first_bad))
    title = (
        f"buffer contents at bucket {c.bucket}, bs {c.bs} ({c.mode}); pad violations: {list(c.violations)}"
    )
    console.print(
        _table(title, ("buffer", "real rows", "pad rows ok", "pad rows broken", "first broken"), rows)
    )


def render(
    snap: Snapshot,
    console: Console,
    kernels: bool = True,
    every_graph: bool = False,
    full_names: bool = False,
) -> None:
    """Print every view of ``snap``: header, graphs, details, buffers, replays, parity."""
    console.print(_table("graphrt snapshot", ("", "value"), report.header_rows(snap)))
    console.print(_table("graphs (mode × bucket)", report.GRAPH_COLUMNS, report.graph_rows(snap)))
    if kernels:
        for graph in _detail_graphs(snap, every_graph):
            _graph_detail(graph, console, full_names)
        largest = max(snap.graphs, key=lambda g: g.bucket, default=None)
        if largest is not None:
            title = f"static buffers read by {largest.mode} bucket {largest.bucket}"
            console.print(_table(title, report.READ_COLUMNS, report.read_rows(largest)))
    console.print(_table("static buffers", report.BUFFER_COLUMNS, report.buffer_rows(snap)))
    for memory in snap.groups:
        if memory.group != snap.memory.group:
            title = f"static buffers: {memory.group} group ({memory.total_bytes} B declared)"
            console.print(_table(title, report.BUFFER_COLUMNS, report.memory_rows(memory)))
    _contents(snap, console)
    console.print(_table("replays", ("", "value"), report.replay_summary(snap)))
    launches = [r.launch_us for r in snap.telemetry.records if r.bucket is not None]
    console.print("launch time histogram\n" + "\n".join(report.histogram(launches)))
    fallbacks = report.fallback_rows(snap) or [("-", "(none)", "0")]
    console.print(_table("eager fallbacks", report.FALLBACK_COLUMNS, fallbacks))
    parity = report.parity_rows(snap) or [("-",) * len(report.PARITY_COLUMNS)]
    console.print(_table("parity: graph vs eager", report.PARITY_COLUMNS, parity))


def run_inspect(args: argparse.Namespace) -> int:
    """``graphrt inspect PATH``: print every view; raises :class:`UsageError` on a bad path."""
    console = wide_console(args.width)  # NOTE: logs and CI are not terminals: not 80 columns
    if not Path(args.path).is_file():
        raise UsageError(
            "PATH", args.path, "is not a file: give a snapshot JSON (graphrt demo --snapshot PATH)"
        )
    try:
        snap = load_snapshot(args.path)
    except SnapshotError as err:  # NOTE: unreadable, damaged or of another version
        raise UsageError("PATH", args.path, f"cannot be read: {err}") from err
    render(
        snap, console, kernels=not args.no_kernels, every_graph=args.all_graphs, full_names=args.full_names
    )
    return 0


__all__ = ["render", "run_inspect"]

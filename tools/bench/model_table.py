"""The terminal table of ``graphrt bench model`` (``tools/bench/model.py`` writes the JSON)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table

from graphrt.tools.bench import anchors
from graphrt.tools.bench.record import fmt_us
from graphrt.tools.cli.console import wide_console

#: Replays profiled per batch size for the kernel breakdown (``device_ops.kernel_breakdown``).
PROFILE_STEPS = 5


def _cell(stats: dict[str, float] | None) -> str:
    return fmt_us(stats) if stats else "—"


def print_table(result: dict[str, Any], out: Path) -> None:
    """The run's rows as a rich table, its caption, and one kernel-breakdown line per row."""
    env, floor = result["env"], result["floor"]
    table = Table(
        title=f"decode step, {result['shape']} ({result['dtype']}), context {result['context']} — "
        f"{env['device']}, {result['backend']}"
    )
    cols = (
        "bs",
        "graphrt µs",
        "× floor",
        "host µs",
        "device µs",
        "× floor",
        "transformers µs",
        "compiled µs",
        "compiled / graphrt",
        "rel err",
        "vs anchors (H100, bs 1) and target",
    )
    for col in cols:
        table.add_column(col, justify="right", no_wrap=True)
    for r in result["rows"]:
        ratio = r["hf_compiled_over_graphrt"]
        errs = [p["rel_l2"] for p in r["parity"].values()]
        table.add_row(
            str(r["bs"]),
            _cell(r["graphrt_us"]),
            f"{r['over_floor']:.2f}x",
            f"{r['host_us']['p50']:.0f}" if "host_us" in r else "—",
            f"{r['device']['span_us']:.0f}" if r["device"]["span_us"] else "—",
            f"{r['device_over_floor']:.2f}x" if r["device_over_floor"] else "—",
            _cell(r["hf_eager_us"]),
            _cell(r["hf_compiled_us"]) if r["hf_compiled_us"] else "skipped",
            f"{ratio:.2f}x" if ratio else "—",
            f"{max(errs):.2g}",
            anchors.summary(r),
        )
    table.caption = (
        f"µs: p50 (p10–p90), {result['timer']}, run() to logits; host µs: run() to its return; device µs: one step of "
        f"{PROFILE_STEPS} replays back to back (profiler); floor {floor['floor_us']:.0f} µs = "
        f"{result['read_bytes'] / 1e9:.3g} GB at {floor['bandwidth_gb_s']:.0f} GB/s (copy); "
        f"parity: rel L2 ≤ {result['parity_check']['tolerance']:g} before timing"
    )
    skipped = sorted({r["compile_skipped"] for r in result["rows"] if not r["hf_compiled_us"]})
    if skipped:
        table.caption += f"; compiled skipped: {'; '.join(skipped)}"
    if result["compile"]["cudagraph_skips"]:
        table.caption += f"; Inductor skipped CUDA graphs {result['compile']['cudagraph_skips']}x (see log)"
    if result["engine"] != "cuda":
        table.caption += "; graphs are emulated on the CPU: not a GPU speed"
    console = wide_console()
    console.print(table)
    console.print(f"{result['seconds']:.0f} s in all; written to {out}")
    for r in result["rows"]:
        if r["device"]["busy_us"] is not None:
            console.print(_kernels_line(r))


def _kernels_line(row: dict[str, Any]) -> str:
    """Where one graphrt step spends its device time: busy, idle between kernels, top kernels."""
    d = row["device"]
    top = ", ".join(f"{k['kernel']} {k['us']:.0f} µs x{k['launches']:.0f}" for k in d["kernels"][:6])
    edges = row.get("pdl_edges")  # NOTE: absent in files written before it
    pdl = "" if edges is None else f" ({edges} programmatic edges)"
    return (
        f"bs {row['bs']} device: {d['busy_us']:.0f} µs busy of {d['span_us']:.0f} µs "
        f"({d['idle_share']:.1%} idle), {d['launches']:.0f} launches, graph of "
        f"{row['graph_nodes']} nodes{pdl}; top: {top}"
    )

"""A graph's kernel table and its programmatic-edge summary, for ``graphrt inspect`` and the TUI."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from graphrt.capture.kernels import short_name
from graphrt.debug.snapshot import GraphFacts, KernelFacts

# NOTE: the name goes last: template names are long, and the numbers must stay on screen.
KERNEL_COLUMNS = ("count", "time", "share", "PDL", "grid", "block", "smem", "kernel / op")
#: The ``PDL`` cell of a kernel launched with a programmatic in-edge.
PDL_MARK = "✓"

Row = tuple[str, ...]


def fmt_time(us: float | None) -> str:
    """Microseconds in the unit that reads best: ``850 ns``, ``12.3 µs``, ``4.20 ms``, ``1.50 s``."""
    if us is None:
        return "-"
    if us < 1:
        return f"{us * 1e3:.0f} ns"
    if us < 1e3:
        return f"{us:.3g} µs" if us < 100 else f"{us:.0f} µs"
    if us < 1e6:
        return f"{us / 1e3:.3g} ms" if us < 1e5 else f"{us / 1e3:.0f} ms"
    return f"{us / 1e6:.3g} s"


def _grouped(kernels: Sequence[KernelFacts]) -> list[KernelFacts]:
    """One entry per name (snapshots taken before grouping list a kernel once per launch dims)."""
    by_name: dict[str, list[KernelFacts]] = {}
    for k in kernels:
        by_name.setdefault(k.name, []).append(k)

    def joined(values: Iterable[str]) -> str:
        return " | ".join(dict.fromkeys(p for v in values for p in v.split(" | ") if p))

    out = []
    for name, ks in by_name.items():
        times = [k.time_us for k in ks if k.time_us is not None]
        out.append(
            KernelFacts(
                name,
                sum(k.count for k in ks),
                joined(k.grid for k in ks),
                joined(k.block for k in ks),
                joined(k.smem for k in ks),
                sum(times) if times else None,
                any(k.pdl for k in ks),
            )
        )
    return out


def kernel_rows(graph: GraphFacts, full_names: bool = False) -> list[Row]:
    """One row per kernel name: count, time, share of the graph's time, PDL (``✓``: a launch of
    it has a programmatic in-edge), grid, block, smem, name.

    Sorted by time when recorded, else by count. Names keep two levels of template
    arguments unless ``full_names``.
    """
    kernels = _grouped(graph.kernels)
    total = sum(k.time_us or 0.0 for k in kernels)
    kernels.sort(key=lambda k: (-(k.time_us or 0.0), -k.count, k.name))
    return [
        (
            str(k.count),
            fmt_time(k.time_us),
            f"{100 * k.time_us / total:.1f}%" if k.time_us is not None and total else "-",
            PDL_MARK if k.pdl else "",
            k.grid or "-",
            k.block or "-",
            k.smem or "-",
            k.name if full_names else short_name(k.name),
        )
        for k in kernels
    ]


def pdl_summary(graph: GraphFacts) -> str:
    """``"N programmatic edges of M"`` (PDL: a kernel may start while the one before it
    finishes), or why it is unknown."""
    if graph.programmatic_edges is None or graph.edges is None:
        return "programmatic edges not read (needs cuda-python's cuda.bindings on CUDA)"
    return f"{graph.programmatic_edges} programmatic edges of {graph.edges}"

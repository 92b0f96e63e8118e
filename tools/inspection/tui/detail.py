"""View 2, Graph detail: kernels (or recorded ops), host scalars, static buffers it reads."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.widgets import DataTable, Static

from graphrt.debug.snapshot import GraphFacts
from graphrt.tools.inspection import report
from graphrt.tools.inspection.tui.base import View, fill, table


class DetailView(View):
    """View 2: one graph's kernels (or recorded ops), host scalars and buffers read."""

    keys_help = "[ ]: prev/next graph"

    def compose(self) -> ComposeResult:
        """Title, kernel table, host scalars, buffers read."""
        yield Static(id="detail-title")
        yield table("detail-kernels")
        yield Static(id="detail-scalars")
        yield table("detail-reads")

    def on_mount(self) -> None:
        """Start on the last graph (largest bucket of the last mode)."""
        graphs = self.ordered()
        self.current: GraphFacts | None = graphs[-1] if graphs else None
        self.refresh_view()

    def ordered(self) -> list[GraphFacts]:
        """Every graph by (mode, bucket)."""
        return sorted(self.snap.graphs, key=lambda g: (g.mode, g.bucket))

    def show(self, mode: str, bucket: int) -> None:
        """Show the graph of ``(mode, bucket)``."""
        self.current = self.snap.graph(mode, bucket)
        self.refresh_view()

    def step(self, delta: int) -> None:
        """Show the previous / next graph."""
        graphs = self.ordered()
        if graphs and self.current is not None:
            i = graphs.index(self.current)
            self.current = graphs[(i + delta) % len(graphs)]
            self.refresh_view()

    def refresh_view(self) -> None:
        """Redraw the current graph's title and tables (search applied)."""
        g = self.current
        title = self.query_one("#detail-title", Static)
        if g is None:
            title.update("[b]Graph detail[/b] │ no graphs captured")
            return
        timed = sum(k.time_us or 0.0 for k in g.kernels)
        source = "CUDA graph debug dump" if self.snap.engine == "cuda" else "emulated engine's recorded ops"
        title.update(
            f"[b]Graph detail[/b] │ {g.mode} bucket {g.bucket}: {g.num_nodes} nodes "
            f"({report.pdl_summary(g)}), "
            f"{len({k.name for k in g.kernels})} distinct kernels ({source}), "
            f"captured in {report.fmt_time(g.capture_ms * 1e3)}, {g.replays} replays"
            + (f", kernels {report.fmt_time(timed)} per replay" if timed else "")
        )
        kernels = [r for r in report.kernel_rows(g) if self.matches(r[-1])]
        fill(self.query_one("#detail-kernels", DataTable), report.KERNEL_COLUMNS, kernels)
        scalars = ", ".join(f"{k}={v}" for k, v in report.host_scalar_rows(g)) or "none"
        self.query_one("#detail-scalars", Static).update(f"[b]host scalars at capture[/b] │ {scalars}")
        reads = [r for r in report.read_rows(g) if self.matches(r[0])]
        fill(self.query_one("#detail-reads", DataTable), report.READ_COLUMNS, reads)

"""View 1, Graphs: the mode × bucket grid."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.message import Message
from textual.widgets import DataTable, Static

from graphrt.tools.inspection import report
from graphrt.tools.inspection.tui.base import View, fill, table


class GraphsView(View):
    """View 1: the mode × bucket grid; ``enter`` opens a graph's detail."""

    keys_help = "enter: open graph"

    class Open(Message):
        """Open the detail view of ``(mode, bucket)``."""

        def __init__(self, mode: str, bucket: int) -> None:
            super().__init__()
            self.mode, self.bucket = mode, bucket

    def compose(self) -> ComposeResult:
        """Title and the grid."""
        yield Static(id="graphs-title")
        yield table("graphs-table")

    def refresh_view(self) -> None:
        """Redraw the grid (search applied): failures red, uncaptured dim."""
        snap = self.snap
        rows = [r for r in report.graph_rows(snap) if self.matches(r[0], f"{r[0]} {r[1]}")]
        styles = ["red" if r[8].startswith("FAIL") else "dim" if r[2] == "no" else "" for r in rows]
        self._rows = rows
        fill(self.query_one("#graphs-table", DataTable), report.GRAPH_COLUMNS, rows, styles)
        captured = sum(r[2] == "yes" for r in rows)
        self.query_one("#graphs-title", Static).update(
            f"[b]Graphs[/b] │ {captured} captured ({snap.engine} engine, {snap.backend} backend)  "
            f"pool {sum(g.pool_bytes for g in snap.graphs) / 2**20:.1f} MiB  "
            f"fallbacks {sum(f.count for f in snap.fallbacks)}"
        )

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        """Open the detail of a captured row."""
        row = self._rows[int(event.row_key.value or 0)]
        if row[2] == "yes":
            self.post_message(self.Open(row[0], int(row[1])))

"""View 5, Parity: per mode and bucket, graph vs eager max difference and where it first appears."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.widgets import DataTable, Static

from graphrt.tools.inspection import report
from graphrt.tools.inspection.tui.base import View, fill, table


class ParityView(View):
    """View 5: graph vs eager per mode and bucket."""

    keys_help = "↑↓: rows"

    def compose(self) -> ComposeResult:
        """Title and the parity table."""
        yield Static(id="parity-title")
        yield table("parity-table")

    def refresh_view(self) -> None:
        """Redraw the parity table (search applied): failures red."""
        rows = [r for r in report.parity_rows(self.snap) if self.matches(r[0], f"{r[0]} {r[1]}")]
        failed = sum(r[7] == "FAIL" for r in rows)
        if not self.snap.parity:
            text = "no parity results in this snapshot (take one with graphrt demo --snapshot)"
        else:
            text = f"{len(rows)} checks, [{'red' if failed else 'green'}]{failed} failed[/]; "
            text += "compared on real rows only; first > tol is (token, column) in row-major order"
        self.query_one("#parity-title", Static).update(f"[b]Parity[/b] │ graph vs eager: {text}")
        styles = ["bold red" if r[7] == "FAIL" else "green" for r in rows]
        fill(self.query_one("#parity-table", DataTable), report.PARITY_COLUMNS, rows, styles)

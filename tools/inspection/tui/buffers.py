"""View 3, Buffers: every static buffer with its bytes, and its live rows for a chosen bucket."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.widgets import DataTable, Static

from graphrt.tools.inspection import report
from graphrt.tools.inspection.tui.base import View, fill, table

#: Row styles: pad rows are quiet, rows that break the pad rule shout, stale rows fade.
STATUS_STYLE = {"real": "", "pad": "green", "pad!": "bold white on red", "stale": "dim italic"}
CONTENT_COLUMNS = ("row", "status", "values")


class BuffersView(View):
    """View 3: every static buffer, and the rows of one for a chosen bucket."""

    keys_help = "[ ]: bucket  ↑↓: buffer"

    def compose(self) -> ComposeResult:
        """Title, buffer table, contents title, contents table."""
        yield Static(id="buffers-title")
        yield table("buffers-table")
        yield Static(id="buffers-contents-title")
        yield table("buffers-contents")

    def on_mount(self) -> None:
        """Start at the bucket the last step wrote, on the first buffer."""
        buckets = self.buckets()
        written = self.snap.contents.bucket
        self.bucket = written if written in buckets else (buckets[-1] if buckets else 1)
        self.selected = self.snap.memory.buffers[0].name if self.snap.memory.buffers else ""
        self.refresh_view()

    def buckets(self) -> list[int]:
        """Every captured bucket, ascending."""
        return sorted({g.bucket for g in self.snap.graphs})

    def step(self, delta: int) -> None:
        """Show the previous / next bucket's rows."""
        buckets = self.buckets()
        if buckets:
            i = buckets.index(self.bucket) if self.bucket in buckets else 0
            self.bucket = buckets[(i + delta) % len(buckets)]
            self.refresh_contents()

    def refresh_view(self) -> None:
        """Redraw the buffer table (search applied) and the selected buffer's rows."""
        m = self.snap.memory
        self.query_one("#buffers-title", Static).update(
            f"[b]Buffers[/b] │ group {m.group!r}: {len(m.buffers)} buffers, {m.total_bytes} B declared, "
            f"arena {m.arena_bytes} B (device), {m.host_arena_bytes} B (pinned host mirror)"
        )
        self._rows = [r for r in report.buffer_rows(self.snap) if self.matches(r[0])]
        fill(self.query_one("#buffers-table", DataTable), report.BUFFER_COLUMNS, self._rows)
        if self._rows and self.selected not in [r[0] for r in self._rows]:
            self.selected = self._rows[0][0]
        self.refresh_contents()

    def refresh_contents(self) -> None:
        """Redraw the selected buffer's rows: real, pad, broken pad, stale."""
        c = self.snap.contents
        title = self.query_one("#buffers-contents-title", Static)
        shown = report.buffer_contents(self.snap, self.selected, self.bucket) if self._rows else None
        contents = self.query_one("#buffers-contents", DataTable)
        if shown is None or c.bucket is None:
            title.update("[b]contents[/b] │ none: no replay before the snapshot, or its .npz is missing")
            fill(contents, CONTENT_COLUMNS, [])
            return
        broken = (
            f"[bold red]{len(shown.broken)} pad rows break the rule[/]" if shown.broken else "pad rule ok"
        )
        title.update(
            f"[b]{self.selected}[/b] at bucket {self.bucket}  (last step: {c.mode} bs {c.bs} in bucket "
            f"{c.bucket}; rows ≥ {c.bs} are pads; ┊ marks page ids past a row's length, unread)  {broken}"
        )
        rows = [(str(i), s, v) for i, (s, v) in enumerate(zip(shown.status, shown.values, strict=True))]
        fill(contents, CONTENT_COLUMNS, rows, [STATUS_STYLE[s] for s in shown.status])

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        """Show the rows of the buffer under the cursor."""
        if event.data_table.id == "buffers-table" and event.row_key.value is not None:
            name = self._rows[int(event.row_key.value)][0]
            if name != self.selected:
                self.selected = name
                self.refresh_contents()

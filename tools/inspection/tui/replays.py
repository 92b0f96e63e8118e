"""View 4, Replays: update and launch times (histogram, recent steps) and eager fallbacks."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import DataTable, Static

from graphrt.tools.inspection import report
from graphrt.tools.inspection.tui.base import View, fill, table


class ReplaysView(View):
    """View 4: update and replay time histograms, eager fallbacks, recent steps."""

    keys_help = "↑↓: steps"

    def compose(self) -> ComposeResult:
        """Summary, two histograms, fallbacks, recent steps."""
        yield Static(id="replays-summary")
        with Horizontal(id="replays-hist"):
            yield Static(id="replays-hist-update")
            yield Static(id="replays-hist-launch")
        yield Static("[b]eager fallbacks[/b]", id="replays-fallbacks-title")
        yield table("replays-fallbacks")
        yield table("replays-recent")

    def refresh_view(self) -> None:
        """Redraw from the telemetry ring (search applied to mode and reason)."""
        snap = self.snap
        summary = " · ".join(f"[b]{k}[/b] {v}" for k, v in report.replay_summary(snap))
        self.query_one("#replays-summary", Static).update(f"[b]Replays[/b] │ {summary}")
        replays = [r for r in snap.telemetry.records if r.bucket is not None]
        timed = [r.replay_us for r in replays if r.replay_us is not None]
        right = ("replay time (synced)", timed) if timed else ("launch time", [r.launch_us for r in replays])
        for widget, (name, values) in (
            ("#replays-hist-update", ("update time", [r.update_us for r in replays])),
            ("#replays-hist-launch", right),
        ):
            self.query_one(widget, Static).update(
                f"[b]{name}[/b]\n" + "\n".join(report.histogram(values, bins=6, width=14))
            )
        fallbacks = [r for r in report.fallback_rows(snap) if self.matches(r[0], r[1])]
        fill(
            self.query_one("#replays-fallbacks", DataTable),
            report.FALLBACK_COLUMNS,
            fallbacks or [("-", "none", "0")],
        )
        recent = [r for r in report.recent_rows(snap) if self.matches(r[1], r[7])]
        styles = ["yellow" if r[7] else "" for r in recent]
        fill(self.query_one("#replays-recent", DataTable), report.RECENT_COLUMNS, recent[::-1], styles[::-1])

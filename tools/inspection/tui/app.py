"""The graph-debug app: five views over one snapshot, switched by number keys."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import ClassVar

from rich.console import Console
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.widgets import ContentSwitcher, Input, Static

from graphrt.debug.snapshot import Snapshot, SnapshotVersionError, load_snapshot
from graphrt.tools.cli.args import UsageError
from graphrt.tools.inspection.tui.base import View
from graphrt.tools.inspection.tui.buffers import BuffersView
from graphrt.tools.inspection.tui.detail import DetailView
from graphrt.tools.inspection.tui.graphs import GraphsView
from graphrt.tools.inspection.tui.parity import ParityView
from graphrt.tools.inspection.tui.replays import ReplaysView

VIEWS = ("graphs", "detail", "buffers", "replays", "parity")
HELP = "1 graphs 2 detail 3 buffers 4 replays 5 parity  / search  esc clear  q quit"


class GraphDebugApp(App[None]):
    """``graphrt debug``: Graphs, Graph detail, Buffers, Replays, Parity over a snapshot."""

    TITLE = "graphrt debug"
    CSS = """
    #top { height: 1; background: $primary; color: $text; }
    #help { dock: bottom; height: 1; background: $panel; color: $text-muted; }
    #search { dock: bottom; height: 1; border: none; padding: 0 1; display: none; }
    #search.shown { display: block; }
    DataTable { height: 1fr; }
    #detail-kernels { height: 2fr; }
    #buffers-table { height: 11; }
    #replays-hist { height: 8; }
    #replays-hist > Static { width: 1fr; }
    #replays-fallbacks { height: 4; }
    Static { padding: 0 1; }
    """
    BINDINGS: ClassVar[list[Binding]] = [
        *(Binding(str(i + 1), f"view('{name}')", name, show=False) for i, name in enumerate(VIEWS)),
        Binding("slash", "search", "search", show=False),
        Binding("escape", "clear_search", "clear", show=False),
        Binding("left_square_bracket", "step(-1)", "prev", show=False),
        Binding("right_square_bracket", "step(1)", "next", show=False),
        Binding("q", "quit", "quit", show=False),
    ]

    def __init__(self, snap: Snapshot, source: str = "") -> None:
        super().__init__()
        self.snap, self.source = snap, source

    def compose(self) -> ComposeResult:
        """Top bar, the five views in a switcher, the search box and the help line."""
        env = self.snap.environment
        yield Static(
            f"graphrt debug  {self.source}  {env.get('device')}  {self.snap.engine}/{self.snap.backend}  "
            f"snapshot v{self.snap.version} {self.snap.created}",
            id="top",
        )
        with ContentSwitcher(initial="graphs", id="views"):
            yield GraphsView(self.snap, id="graphs")
            yield DetailView(self.snap, id="detail")
            yield BuffersView(self.snap, id="buffers")
            yield ReplaysView(self.snap, id="replays")
            yield ParityView(self.snap, id="parity")
        yield Input(placeholder="search by name (enter: keep, esc: clear)", id="search")
        yield Static(id="help")

    def on_mount(self) -> None:
        """Open the Graphs view."""
        self.action_view("graphs")

    @property
    def view(self) -> View:
        """The view on screen."""
        return self.query_one(f"#{self.query_one(ContentSwitcher).current}", View)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # NOTE: while the search box has focus, keys are text, not commands.
        """Disable the key commands while the search box has focus."""
        return not (self.focused is self.query_one("#search") and action not in ("clear_search",))

    def action_view(self, name: str) -> None:
        """Show view ``name``, apply the search to it and focus its first table."""
        self.query_one(ContentSwitcher).current = name
        view = self.view
        view.search(self.query_one("#search", Input).value)
        self.query_one("#help", Static).update(f"{HELP}  │ {view.keys_help}")
        tables = view.query("DataTable")
        if tables:
            tables.first().focus()

    def action_step(self, delta: int) -> None:
        """``[`` / ``]``: previous / next graph or bucket in views that have one."""
        step = getattr(self.view, "step", None)
        if step is not None:
            step(delta)

    def action_search(self) -> None:
        """``/``: show and focus the search box."""
        box = self.query_one("#search", Input)
        box.add_class("shown")
        box.focus()

    def action_clear_search(self) -> None:
        """``esc``: clear and hide the search box."""
        box = self.query_one("#search", Input)
        box.value = ""
        box.remove_class("shown")
        self.view.search("")
        self.action_view(self.query_one(ContentSwitcher).current or "graphs")

    def on_input_changed(self, event: Input.Changed) -> None:
        """Filter the current view as the search text changes."""
        self.view.search(event.value)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        """``enter`` in the search box: keep the filter, return to the view."""
        self.action_view(self.query_one(ContentSwitcher).current or "graphs")

    def on_graphs_view_open(self, message: GraphsView.Open) -> None:
        """Open the detail view of the graph chosen in the Graphs view."""
        self.action_view("detail")
        self.query_one(DetailView).show(message.mode, message.bucket)


def demo_snapshot(directory: str) -> Path:
    """A small CPU demo run (emulated graphs), snapshotted into ``directory``."""
    from graphrt.engine import Engine
    from graphrt.tools.cli.demo import demo_prompts, write_snapshot

    engine = Engine("tiny-llama", device="cpu", max_batch_size=8, max_context_len=128)
    prompts, budgets = demo_prompts(6, 8, engine.model.vocab_size, random_lengths=True)
    engine.runtime.telemetry.sync = True
    engine.generate(prompts, budgets)
    path = Path(directory) / "demo.json"
    write_snapshot(engine, str(path))
    return path


def run_debug(args: argparse.Namespace) -> int:
    """``graphrt debug``: the app over ``args.path`` (or a fresh CPU demo run); 0 on success."""
    if args.path and not Path(args.path).is_file():
        raise UsageError(
            "PATH", args.path, "is not a file: give a snapshot JSON (graphrt demo --snapshot PATH)"
        )
    with tempfile.TemporaryDirectory() as tmp:
        if args.path:
            path = Path(args.path)
        else:
            with Console(stderr=True).status(
                "no snapshot given: running a small CPU demo and snapshotting it"
            ):
                path = demo_snapshot(tmp)
        try:
            snap = load_snapshot(path)
        except (SnapshotVersionError, json.JSONDecodeError) as err:
            raise UsageError("PATH", str(path), f"cannot be read: {err}") from err
        app = GraphDebugApp(snap, str(args.path or "fresh CPU demo"))
        if args.screenshots:
            from graphrt.tools.inspection.tui.screenshots import save_screenshots

            save_screenshots(app, Path(args.screenshots))
            return 0
        app.run()
    return 0

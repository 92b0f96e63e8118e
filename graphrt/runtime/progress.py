"""Capture progress with rich (a no-op when not shown)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


@contextmanager
def capture_progress(total: int, show: bool) -> Iterator[Callable[[str], None]]:
    """Yields ``advance(label)``; renders a bar with the graph just captured when shown."""
    if not show:
        yield lambda label: None
        return
    columns = (
        TextColumn("[bold]capturing[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
    )
    # NOTE: stderr, so that a command's stdout (tables, JSON) pipes cleanly
    with Progress(*columns, transient=False, console=Console(stderr=True)) as progress:
        task = progress.add_task("", total=total)
        yield lambda label: progress.update(task, advance=1, description=label)

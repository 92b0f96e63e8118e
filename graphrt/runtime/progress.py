"""Load and capture progress with rich (no-ops when not shown)."""

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


@contextmanager
def load_progress(show: bool) -> Iterator[Callable[[int, int], None]]:
    """Yields ``advance(done, total)`` for a checkpoint's tensors: a bar on stderr when shown,
    from the first call on (a preset reads no tensors and shows none)."""
    bar: Progress | None = None
    task = None

    def advance(done: int, total: int) -> None:
        nonlocal bar, task
        if not show:
            return
        if bar is None:
            columns = (TextColumn("[bold]loading[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
            bar = Progress(*columns, console=Console(stderr=True))
            bar.start()
            task = bar.add_task("", total=total)
        bar.update(task, completed=done, total=total)  # type: ignore[arg-type]

    try:
        yield advance
    finally:
        if bar is not None:
            bar.stop()

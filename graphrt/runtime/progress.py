"""Load and capture progress with rich (no-ops when not shown)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.progress import Progress


def _bar(*labels: str) -> Progress:
    """A rich bar on stderr (so that a command's stdout pipes cleanly): ``labels``, the bar,
    done / total, the elapsed time. rich is imported here, when a bar is shown, not with graphrt."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    head: list[Any] = [TextColumn(labels[0]), BarColumn(), MofNCompleteColumn()]
    tail: list[Any] = [TextColumn(t) for t in labels[1:]]
    return Progress(*head, *tail, TimeElapsedColumn(), console=Console(stderr=True))


@contextmanager
def capture_progress(total: int, show: bool) -> Iterator[Callable[[str], None]]:
    """Yields ``advance(label)``; renders a bar with the graph just captured when shown."""
    if not show:
        yield lambda label: None
        return
    with _bar("[bold]capturing[/]", "{task.description}") as progress:
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
            bar = _bar("[bold]loading[/]")
            bar.start()
            task = bar.add_task("", total=total)
        bar.update(task, completed=done, total=total)  # type: ignore[arg-type]

    try:
        yield advance
    finally:
        if bar is not None:
            bar.stop()

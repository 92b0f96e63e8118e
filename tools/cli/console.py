"""Consoles and progress bars for the commands: tables that never truncate, progress on stderr."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # NOTE: rich is imported when a console is made: ``generate`` needs none
    from rich.console import Console
    from rich.progress import Progress

#: Width of tables written to a pipe or file (rich would otherwise assume 80 columns).
PIPE_WIDTH = 160


def progress_wanted() -> bool:
    """Progress bars only on a terminal (stderr): a pipe or a log file gets none."""
    return sys.stderr.isatty()


def wide_console(width: int | None = None) -> Console:
    """A stdout console ``width`` wide; when stdout is not a terminal, :data:`PIPE_WIDTH` wide."""
    from rich.console import Console

    if width is None and not sys.stdout.isatty():
        width = PIPE_WIDTH
    return Console(width=width) if width else Console()


def bench_progress(show: bool = True) -> Progress:
    """A progress bar on stderr: what runs now, done / total, elapsed time (``show``: else silent)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("[bold]measuring[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=not show,
    )

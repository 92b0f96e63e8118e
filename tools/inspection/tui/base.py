"""What every view shares: the snapshot, the search filter, and table filling."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.containers import Vertical
from textual.widgets import DataTable

from graphrt.debug.snapshot import Snapshot

Row = Sequence[str]


class View(Vertical):
    """One screen of the app. Subclasses rebuild their widgets in :meth:`refresh_view`."""

    #: Shown in the help line while this view is open.
    keys_help = ""

    def __init__(self, snap: Snapshot, *, id: str) -> None:
        super().__init__(id=id)
        self.snap = snap
        self.query_text = ""

    def matches(self, *names: str) -> bool:
        """Whether a row named ``names`` passes the search (case-insensitive substring)."""
        q = self.query_text.lower()
        return not q or any(q in n.lower() for n in names)

    def search(self, text: str) -> None:
        """Keep rows whose name contains ``text`` (case-insensitive) and redraw."""
        self.query_text = text
        self.refresh_view()

    def refresh_view(self) -> None:  # pragma: no cover - every view overrides it
        """Redraw every widget of the view from the snapshot and the search text."""
        raise NotImplementedError

    def on_mount(self) -> None:
        """Draw the view once it is mounted."""
        self.refresh_view()


def table(id: str) -> DataTable:
    """A row-cursor, zebra-striped ``DataTable`` with ``id``."""
    t: DataTable = DataTable(id=id, cursor_type="row", zebra_stripes=True)
    return t


def fill(t: DataTable, columns: Sequence[str], rows: Sequence[Row], styles: Sequence[str] = ()) -> None:
    """Replace ``t``'s contents; ``styles[i]`` (a rich style) colours row ``i``."""
    t.clear(columns=True)
    t.add_columns(*columns)
    for i, row in enumerate(rows):
        style = styles[i] if i < len(styles) else ""
        # NOTE: cells are data ("[max_bs]" is not markup), so they go in as Text.
        t.add_row(*(Text(str(c), style=style) for c in row), key=str(i))

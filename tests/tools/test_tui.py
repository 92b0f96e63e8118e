"""``graphrt debug``: Textual's headless pilot through all five views at 100×30."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

pytest.importorskip("textual")

from textual.widgets import DataTable, Input, Static

from graphrt.debug.snapshot import load_snapshot
from graphrt.tools.inspection.tui.app import VIEWS, GraphDebugApp
from graphrt.tools.inspection.tui.screenshots import save_screenshots
from tests.support.snapshots import take

SIZE = (100, 30)


@pytest.fixture(scope="module")
def snap_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return take(tmp_path_factory.mktemp("tui"), corrupt=True)[2]


def rows(app: GraphDebugApp, table_id: str) -> list[list[str]]:
    t = app.query_one(f"#{table_id}", DataTable)
    return [[str(c) for c in t.get_row_at(i)] for i in range(t.row_count)]


def text(app: GraphDebugApp, static_id: str) -> str:
    return str(app.query_one(f"#{static_id}", Static).content)


async def walk(app: GraphDebugApp) -> None:
    async with app.run_test(size=SIZE) as pilot:
        # 1 Graphs: the mode × bucket grid, the bucket nothing fits, parity per bucket
        grid = rows(app, "graphs-table")
        assert [r[1] for r in grid] == ["1", "2", "4", ">4"]
        assert grid[2][2:4] == ["yes", grid[2][3]] and grid[2][8].startswith("ok") and grid[3][7] == "1"
        assert "1 graphs" in text(app, "help")
        # enter on the first row opens its detail
        await pilot.press("enter")
        assert app.query_one("ContentSwitcher").current == "detail"
        assert "DECODE bucket 1" in text(app, "detail-title")
        await pilot.press("right_square_bracket")
        assert "DECODE bucket 2" in text(app, "detail-title")
        kernels = rows(app, "detail-kernels")
        assert "index_put_" in [r[-1] for r in kernels]
        # the PDL column: blank for every op on the CPU, and the graph's programmatic-edge count
        columns = [str(c.label) for c in app.query_one("#detail-kernels", DataTable).columns.values()]
        assert columns[3] == "PDL" and {r[3] for r in kernels} == {""}
        assert "0 programmatic edges of " in text(app, "detail-title")
        assert "max_seqlen_q=1" in text(app, "detail-scalars")
        reads = {r[0]: r for r in rows(app, "detail-reads")}
        assert reads["cu_seqlens_q"][1] == "3" and reads["page_table"][3].startswith("0x")
        # 3 Buffers: every buffer, then contents of a chosen one with the broken pad row
        await pilot.press("3")
        assert len(rows(app, "buffers-table")) == 9  # the STEP_SPECS table
        await pilot.press("slash", *"seqlens_q")
        assert [r[0] for r in rows(app, "buffers-table")] == ["cu_seqlens_q"]
        await pilot.press("escape", "slash", *"cache_seq", "enter")
        assert [r[0] for r in rows(app, "buffers-table")] == ["cache_seqlens"]
        assert [r[1] for r in rows(app, "buffers-contents")] == ["real", "real", "real", "pad!"]
        assert "1 pad rows break the rule" in text(app, "buffers-contents-title")
        await pilot.press("left_square_bracket")
        assert len(rows(app, "buffers-contents")) == 2  # bucket 2: rows 0-1 only
        await pilot.press("escape")
        assert len(rows(app, "buffers-table")) == 9 and not app.query_one("#search", Input).value
        # 4 Replays: newest step first, the fallback with its reason, histograms
        await pilot.press("4")
        recent = rows(app, "replays-recent")
        assert [r[2] for r in recent] == ["3", "2", "1", "5", "2"]
        assert recent[3][7] == "bs 5 > largest bucket 4"
        assert rows(app, "replays-fallbacks") == [["DECODE", "bs 5 > largest bucket 4", "1"]]
        assert "update time" in text(app, "replays-hist-update")
        # 5 Parity
        await pilot.press("5")
        assert [(r[1], r[2], r[7]) for r in rows(app, "parity-table")] == [
            ("1", "1", "ok"),
            ("2", "2", "ok"),
            ("4", "3", "ok"),
        ]
        await pilot.press("2")
        assert app.query_one("ContentSwitcher").current == "detail"
        await pilot.press("q")


def test_every_view(snap_path: Path) -> None:
    asyncio.run(walk(GraphDebugApp(load_snapshot(snap_path), str(snap_path))))


def test_screenshots_one_svg_per_view(snap_path: Path, tmp_path: Path) -> None:
    paths = save_screenshots(GraphDebugApp(load_snapshot(snap_path)), tmp_path)
    assert [p.name for p in paths] == [f"tui-{v}.svg" for v in VIEWS]
    assert all(p.read_text().startswith("<svg") for p in paths)
    assert "cu_seqlens_q" in (tmp_path / "tui-buffers.svg").read_text()

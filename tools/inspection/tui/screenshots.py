"""One SVG per view of the app (docs/tui-*.svg), taken headless at 100×30."""

from __future__ import annotations

import asyncio
from pathlib import Path

from graphrt.tools.inspection.tui.app import VIEWS, GraphDebugApp

SIZE = (100, 30)


async def _take(app: GraphDebugApp, directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    async with app.run_test(size=SIZE) as pilot:
        for i, name in enumerate(VIEWS):
            await pilot.press(str(i + 1))
            await pilot.pause()
            path = directory / f"tui-{name}.svg"
            app.save_screenshot(path.name, str(directory))
            paths.append(path)
    return paths


def save_screenshots(app: GraphDebugApp, directory: Path) -> list[Path]:
    """Open every view in turn and save ``tui-<view>.svg`` under ``directory``."""
    return asyncio.run(_take(app, directory))

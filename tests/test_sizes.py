"""Small files, short functions: no file over 300 lines (tests included), no library function over 60."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ("graphrt", "buffers", "capture", "tools")
MAX_FILE_LINES, MAX_FUNCTION_LINES = 300, 60


def _sources(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def test_no_file_over_300_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in _sources(*LIBRARY, "tests")
        if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES
    }
    assert not long, f"files over {MAX_FILE_LINES} lines: {long}"


def test_no_library_function_over_60_lines() -> None:
    long = []
    for path in _sources(*LIBRARY):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.name} ({lines})")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"

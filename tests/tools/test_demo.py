"""``graphrt demo`` on the CPU: an honest first run (emulated graphs, tokens checked, no speedup)."""

from __future__ import annotations

import pytest

from graphrt.cli import main
from graphrt.tools.cli.demo import demo_prompts

ARGS = ["demo", "--device", "cpu", "--prompts", "3", "--max-new-tokens", "4"]
ARGS += ["--max-batch-size", "4", "--max-context-len", "128"]


@pytest.mark.slow
def test_cpu_demo_checks_tokens_and_prints_no_speedup(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(ARGS) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "emulated graphs vs eager (correctness)" in out
    assert "tokens identical │ yes (12 tokens compared)" in out and "requests / new tokens │ 3 / 12" in out
    assert "│ speedup" not in out and "steps/s" not in out  # no speed row
    assert "graphs are emulated on the CPU" in out and "not speed" in out


def test_budgets_are_fixed_unless_random_lengths_asked_for() -> None:
    prompts, budgets = demo_prompts(5, 40, vocab=512)
    assert budgets == [40] * 5 and all(4 <= len(p) <= 64 for p in prompts)
    _, drawn = demo_prompts(5, 40, vocab=512, random_lengths=True)
    assert all(10 <= b <= 40 for b in drawn) and drawn != budgets
    assert demo_prompts(5, 40, vocab=512, random_lengths=True)[1] == drawn  # seeded

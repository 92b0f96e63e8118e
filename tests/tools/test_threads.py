"""``--threads``: every command takes it; the default is OMP_NUM_THREADS when set, else half the
usable CPUs between 1 and 4; applying it sets torch's intra-op threads."""

from __future__ import annotations

import os

import pytest
import torch

from graphrt.cli import build_parser
from graphrt.tools.cli.threads import MAX_DEFAULT, apply_threads, default_threads


@pytest.mark.parametrize(
    "argv", [["generate", "--prompt", "hi"], ["serve"], ["demo"], ["bench", "sampler"], ["inspect", "x.json"]]
)
def test_every_command_takes_threads(argv: list[str]) -> None:
    assert build_parser().parse_args([*argv, "--threads", "3"]).threads == 3
    assert build_parser().parse_args(argv).threads is None


def test_the_default_leaves_cpus_to_the_box(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert default_threads() == 5
    monkeypatch.delenv("OMP_NUM_THREADS")
    usable = len(os.sched_getaffinity(0))
    assert default_threads() == max(1, min(usable // 2, MAX_DEFAULT))
    before = torch.get_num_threads()
    try:
        assert apply_threads(1) == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)

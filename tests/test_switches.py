"""The switch table (``graphrt.kernels.switches``): declared once, documented once, read once.

Checked: docs/switches.md lists exactly the declared switches with their defaults; at most 19;
no library module but the table reads ``os.environ`` beyond process-level settings; a bad value
or an unknown ``GRAPHRT_*`` name is refused naming it; a runtime reads them when it is built and
its capture report carries them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from graphrt.kernels import switches

ROOT = Path(__file__).resolve().parent.parent
#: Process-level settings the library may read itself (torchrun's), by module; XDG's cache home
#: is read by the switch table's ``cache_root``.
PROCESS_LEVEL = {
    "graphrt/parallel/world.py": {"RANK", "LOCAL_RANK", "WORLD_SIZE"},
    "graphrt/serve/guard.py": {"GRAPHRT_API_KEY"},  # NOTE: a secret, not a switch (switches.SETTINGS)
}


def test_docs_table_lists_every_switch_with_its_default() -> None:
    text = (ROOT / "docs" / "switches.md").read_text()
    rows = re.findall(r"^\| `(GRAPHRT_[A-Z0-9_]+)` \| `([^`]*)` \|", text, re.MULTILINE)
    assert rows == [(s.name, s.default) for s in switches.TABLE]
    assert len(switches.TABLE) <= 19


def test_only_the_table_reads_the_environment() -> None:
    for path in sorted((ROOT / "graphrt").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "graphrt/kernels/switches.py":
            continue
        text = path.read_text()
        names = set(re.findall(r"os\.environ(?:\.get\()?\[?\(?\"([A-Z_]+)\"", text))
        names |= set(re.findall(r"\"([A-Z_]+)\" (?:not )?in os\.environ", text))
        assert text.count("os.environ") == 0 or names, f"{rel} reads os.environ by a computed name"
        assert names <= PROCESS_LEVEL.get(rel, set()), f"{rel} reads {names} (declare it in switches.TABLE)"


def test_defaults_parse_and_bad_values_are_refused_naming_them() -> None:
    record = switches.read({})
    assert record["GRAPHRT_SKINNY_GEMM"] == "1" and record["GRAPHRT_PDL"] is True
    assert record["GRAPHRT_P2P_MAX_BYTES"] == 256 * 1024 and record["GRAPHRT_CACHE_MAX_GB"] == 4.0
    assert record.changed() == {} and not record.interpret
    assert switches.read({"GRAPHRT_FUSED_SAMPLER": "interpret", "TRITON_INTERPRET": "1"}).changed() == {
        "GRAPHRT_FUSED_SAMPLER": "interpret"
    }
    bad = {
        "GRAPHRT_SKINNY_GEMM": ("on", "expected one of 1, 0, interpret"),
        "GRAPHRT_PDL": ("yes", "expected 1 or 0"),
        "GRAPHRT_ALLREDUCE": ("multimem", "expected one of nccl, auto, oneshot, p2p"),
        "GRAPHRT_TP_TIMEOUT": ("-1", "expected a positive number of seconds"),
    }
    for name, (value, why) in bad.items():
        with pytest.raises(ValueError, match=f"{name}='{value}': {why}"):
            switches.read({name: value})


def test_unknown_and_removed_switches_are_refused() -> None:
    with pytest.raises(
        ValueError, match=r"unknown switch GRAPHRT_DECODE_ROPE: the switches are GRAPHRT_FUSED_UPDATE"
    ):
        switches.read({"GRAPHRT_DECODE_ROPE": "1"})
    assert switches.read({"GRAPHRT_TEST_SOAK_FRAMES": "4"}).changed() == {}  # the test suite's own


def test_a_runtime_reads_them_when_built_and_reports_them(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.support.util import build_runtime

    cpu = torch.device("cpu")
    monkeypatch.setenv("GRAPHRT_FUSED_OPS", "0")
    runtime = build_runtime(cpu, buckets=(1,), max_batch_size=1, capture=False).runtime
    monkeypatch.setenv("GRAPHRT_FUSED_OPS", "1")  # NOTE: after the build: the runtime keeps its record
    assert runtime.switches["GRAPHRT_FUSED_OPS"] is False
    assert runtime.capture().switches["GRAPHRT_FUSED_OPS"] == "0"
    monkeypatch.setenv("GRAPHRT_CACHE_MAX_GB", "x")
    with pytest.raises(ValueError, match="GRAPHRT_CACHE_MAX_GB='x' is not a number of GiB >= 0"):
        build_runtime(cpu, buckets=(1,), max_batch_size=1, capture=False)

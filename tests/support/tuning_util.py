"""Tests run kernels under a tuning table of their own (small tiles for the interpreter)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from graphrt.kernels import tuning
from graphrt.kernels.tuning import device as tuning_device


def patch_tuning(monkeypatch: pytest.MonkeyPatch, **changes: Any) -> tuning.TuningTable:
    """Make the active table the current one with ``changes`` until the test ends (monkeypatch
    undoes it); a runtime built meanwhile chooses it too (building one installs its device's)."""
    table = replace(tuning.active(), name="test", path="test", **changes)
    monkeypatch.setattr(tuning_device, "_active", [table])
    monkeypatch.setattr(tuning_device, "choose", lambda name: table)
    return table

"""The emulated engine's tests share a fresh engine per test."""

from __future__ import annotations

import pytest

from graphrt.capture import EmulatedEngine


@pytest.fixture
def engine() -> EmulatedEngine:
    return EmulatedEngine()

"""The API reference builds from the docstrings, and the public API has docstrings."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

import graphrt


@pytest.mark.slow
def test_api_reference_builds(tmp_path: Path) -> None:
    pytest.importorskip("pdoc")
    from graphrt.tools.cli.apidoc import api_modules, build_api_docs

    with_tui = True
    try:
        import textual  # noqa: F401
    except ImportError:
        with_tui = False
    pages = build_api_docs(tmp_path, with_tui)
    names = {p.relative_to(tmp_path).as_posix() for p in pages}
    assert {"graphrt/engine.html", "graphrt/runtime.html", "graphrt/capture/kernels.html"} <= names
    assert len(names) >= len(api_modules(with_tui)) - 1  # NOTE: pdoc renders a package as its own page
    engine = (tmp_path / "graphrt" / "engine.html").read_text()
    assert "decode steps replay captured graphs" in engine


def _public_members(obj: type) -> list[str]:
    return [
        name
        for name, member in vars(obj).items()
        if not name.startswith("_") and (inspect.isfunction(member) or isinstance(member, property))
    ]


@pytest.mark.parametrize("name", graphrt.__all__)
def test_public_api_has_docstrings(name: str) -> None:
    obj = getattr(graphrt, name)
    if not inspect.isclass(obj):
        return
    doc = obj.__doc__ or ""
    assert doc.strip() and not doc.startswith(f"{name}("), f"graphrt.{name} has no docstring"
    missing = [m for m in _public_members(obj) if not (getattr(obj, m).__doc__ or "").strip()]
    assert not missing, f"graphrt.{name}: no docstring on {missing}"

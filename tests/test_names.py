"""No module of the library defines a top-level function or class name twice.

A second ``def`` of a name silently replaces the first for every caller, including the ones
written above it: ``decode_kernel`` once had two ``_launch`` functions, and ``attend`` called
the wrong one (a GPU-only path, so only the model tests on a GPU saw it). Ruff's F811 does not
catch a redefinition whose first binding was used before it. Branches of a top-level ``if`` are
alternatives: each is checked together with the module's unconditional definitions.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

from tests.test_sizes import LIBRARY, ROOT, _sources

DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _names(body: list[ast.stmt]) -> list[str]:
    return [node.name for node in body if isinstance(node, DEFS)]


def twice(source: str) -> set[str]:
    """Names a module's top level (with each branch of a top-level ``if``) defines more than once."""
    body = ast.parse(source).body
    common = _names(body)
    paths = [common]
    for node in body:
        if isinstance(node, ast.If):
            paths += [common + _names(node.body), common + _names(node.orelse)]
    return {name for names in paths for name, n in Counter(names).items() if n > 1}


def test_the_check_finds_a_second_definition() -> None:
    assert twice("def a(): pass\ndef b(): a()\ndef a(x): pass\n") == {"a"}
    assert twice("if x:\n    def f(): pass\nelse:\n    def f(): pass\n") == set()
    assert twice("def f(): pass\nif x:\n    def f(): pass\n") == {"f"}


def test_no_module_defines_a_name_twice() -> None:
    found = {
        str(p.relative_to(ROOT)): sorted(n) for p in _sources(*LIBRARY) if (n := twice(Path(p).read_text()))
    }
    assert not found, f"defined twice: {found}"

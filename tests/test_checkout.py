"""A plain checkout is importable: ``PYTHONPATH=<checkout>`` maps the top-level folders.

``buffers/``, ``capture/`` and ``tools/`` install as ``graphrt.buffers`` / ``.capture`` /
``.tools``; without an install ``graphrt/__init__.py`` maps them from beside ``graphrt/``, and a
copy of the checkout is never shadowed by the installed one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_copy_of_checkout_imports_its_own_folders(tmp_path: Path) -> None:
    for name in ("graphrt", "buffers", "capture", "tools"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    code = (
        "import graphrt, graphrt.buffers, graphrt.capture, graphrt.tools;"
        "from graphrt.buffers import StaticBuffers;"
        "print(graphrt.__file__); print(graphrt.buffers.__file__);"
        "print(graphrt.capture.__file__); print(graphrt.tools.__file__)"
    )
    env = os.environ | {"PYTHONPATH": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, check=True
    )
    files = [Path(line) for line in out.stdout.split()]
    assert len(files) == 4
    for f in files:
        assert f.resolve().is_relative_to(tmp_path.resolve()), f"{f} is not from the copy"

"""The API reference, built from the docstrings with pdoc: ``python -m graphrt.tools.cli.apidoc DIR``.

Every module of ``graphrt`` (and its ``buffers``, ``capture`` and ``tools`` packages) is
imported and rendered as HTML under ``DIR``; an import error fails the build.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import warnings
from pathlib import Path

#: Packages whose modules the reference covers; ``tools.tui`` needs the tui extra.
PACKAGES = ("graphrt", "graphrt.buffers", "graphrt.capture", "graphrt.tools")


def api_modules(with_tui: bool = True) -> list[str]:
    """Every documented module name (``__main__`` excluded; the TUI only ``with_tui``)."""
    names: set[str] = set()
    for top in PACKAGES:
        pkg = importlib.import_module(top)
        names |= {top, *(m.name for m in pkgutil.walk_packages(pkg.__path__, f"{top}."))}
    return sorted(
        n
        for n in names
        if not n.endswith("__main__") and (with_tui or not n.startswith("graphrt.tools.inspection.tui"))
    )


def build_api_docs(out: Path, with_tui: bool = True) -> list[Path]:
    """Render the reference into ``out``; returns the HTML files. Raises on import errors."""
    import pdoc

    modules = api_modules(with_tui)
    with warnings.catch_warnings():
        # NOTE: a package spec already adds its submodules; listing them again only warns.
        warnings.filterwarnings("ignore", message=".*has already been added")
        # NOTE: Textual's own annotations name classes pdoc cannot resolve; not ours to fix.
        warnings.filterwarnings("ignore", message="Error parsing type annotation")
        warnings.filterwarnings("ignore", message="Failed to run TYPE_CHECKING code")
        pdoc.pdoc(*modules, output_directory=out)
    return sorted(out.rglob("*.html"))


def main(argv: list[str] | None = None) -> int:
    """``python -m graphrt.tools.cli.apidoc [DIR]`` (default ``docs/api``)."""
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0] if args else "docs/api")
    pages = build_api_docs(out)
    print(f"{len(pages)} pages in {out}/ (open {out / 'index.html'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

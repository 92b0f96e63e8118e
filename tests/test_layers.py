"""The layering guard: every module imports only its own layer or lower ones, and no import circle.

Read from the source with ``ast`` (every ``import``, lazy ones included), after importing every
module once so a broken import fails here too. The table is the architecture of
docs/architecture.md: one line per layer, lowest first.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import graphrt

#: (rank, module prefix). A module may import a module of its own layer or of a lower rank;
#: layers of equal rank are siblings and may not import each other.
LAYERS: tuple[tuple[int, str], ...] = (
    (0, "graphrt.buffers"),
    (0, "graphrt.capture"),
    (1, "graphrt.step"),
    (1, "graphrt.kernels"),  # Triton kernels, PDL and launch helpers, scratch, switches: no model, no mode
    (2, "graphrt.kv"),
    (3, "graphrt.metadata"),
    (3, "graphrt.parallel"),  # TP groups, collectives as ops, step broadcast: below the models
    (4, "graphrt.attention"),
    (5, "graphrt.models"),
    (5, "graphrt.runtime"),
    (6, "graphrt.checkpoints"),  # safetensors, GGUF, configs and the conversion cache, read into models
    (7, "graphrt.engine"),
    (7, "graphrt.text"),  # tokenizers, chat templates, streamed text: beside the engine, which is ids only
    (8, "graphrt"),  # the package's own __init__: the public facade
    (8, "graphrt.hf"),  # facade of the transformers wrapper (models.hf_wrap + engine.stack)
    (9, "graphrt.debug"),
    (9, "graphrt.serve"),  # the OpenAI-compatible server over graphrt.LLM (FastAPI + uvicorn)
    (10, "graphrt.tools"),
    (11, "graphrt.cli"),  # the console entry point: dispatches to tools
    (12, "graphrt.__main__"),
)


def layer_of(module: str) -> tuple[int, str]:
    """The most specific layer whose prefix names ``module``."""
    hits = [(rank, p) for rank, p in LAYERS if module == p or module.startswith(p + ".")]
    assert hits, f"module {module} is in no layer: add it to LAYERS"
    return max(hits, key=lambda hit: len(hit[1]))


def all_modules() -> list[str]:
    names = ["graphrt"]
    for info in pkgutil.walk_packages(graphrt.__path__, "graphrt."):
        names.append(info.name)
    return sorted(names)


def source_of(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None
    return Path(spec.origin)


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    is_package = source_of(module).name == "__init__.py"
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _type_checking_lines(tree: ast.Module) -> set[int]:
    """Line numbers of imports under ``if TYPE_CHECKING:`` (never executed)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in ast.walk(node):
                lines.add(getattr(inner, "lineno", -1))
    return lines


def imports_of(module: str, known: set[str]) -> list[tuple[str, bool]]:
    """``(imported graphrt module, at module level?)`` for every import statement."""
    tree = ast.parse(source_of(module).read_text())
    top = {id(n) for n in tree.body}
    hidden = _type_checking_lines(tree)
    found: list[tuple[str, bool]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, node)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        eager = id(node) in top and node.lineno not in hidden
        found += [(t, eager) for t in targets if t == "graphrt" or t.startswith("graphrt.")]
    return found


def _import(name: str) -> None:
    """Import ``name``; an optional third-party package (textual, sgl_kernel) may be missing."""
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as err:
        if (err.name or "").startswith("graphrt"):
            raise


@pytest.fixture(scope="module")
def graph() -> dict[str, list[tuple[str, bool]]]:
    modules = all_modules()
    for name in modules:
        if name != "graphrt.__main__":  # NOTE: importing it runs the CLI
            _import(name)
    known = set(modules)
    return {m: imports_of(m, known) for m in modules}


def test_every_module_has_a_layer(graph: dict[str, list[tuple[str, bool]]]) -> None:
    for module in graph:
        layer_of(module)


def test_no_import_runs_up_the_layers(graph: dict[str, list[tuple[str, bool]]]) -> None:
    bad = []
    for module, targets in graph.items():
        rank, own = layer_of(module)
        for target, _ in targets:
            t_rank, t_layer = layer_of(target)
            if t_layer != own and t_rank >= rank:
                bad.append(f"{module} ({own}, rank {rank}) imports {target} ({t_layer}, rank {t_rank})")
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


def test_no_import_circle(graph: dict[str, list[tuple[str, bool]]]) -> None:
    edges = {m: sorted({t for t, eager in ts if eager and t in graph and t != m}) for m, ts in graph.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in edges[node]:
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt] if nxt in path else [*path, nxt]
            if nxt not in state and (cycle := visit(nxt, [*path, nxt])):
                return cycle
        state[node] = 2
        return None

    for module in edges:
        if module not in state and (cycle := visit(module, [module])):
            pytest.fail("import circle: " + " -> ".join(cycle))


def test_runtime_never_imports_debug_aids(graph: dict[str, list[tuple[str, bool]]]) -> None:
    for module, targets in graph.items():
        if layer_of(module)[1] in ("graphrt.debug", "graphrt.tools", "graphrt.cli", "graphrt.__main__"):
            continue
        assert not [t for t, _ in targets if t.startswith(("graphrt.debug", "graphrt.tools"))], module


def test_pyproject_lists_every_package() -> None:
    """A wheel (not only an editable install) must carry every subpackage."""
    tomllib = pytest.importorskip("tomllib")  # NOTE: Python 3.11+

    root = Path(__file__).resolve().parents[1]
    tool = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(tool["packages"])
    for name, folder in tool["package-dir"].items():
        for init in (root / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(root / folder).parts
            assert ".".join((name, *rel)) in listed, f"{init.parent} is not in pyproject's packages"

"""``docs/recipes.md`` followed as written, in a copy of the package: a toy buffer group and a toy
forward mode are added by the recipes' edits alone, and a runtime then writes the group (pad
rows by its rule, every element under the debug poison) and replays the mode's graph equal to
its eager run. The toy backend (the first recipe) is held to the reference by
``tests/attention/test_conformance.py``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: What a copy needs to import graphrt and the test builders.
TREE = ("graphrt", "buffers", "capture", "tools", "tests/__init__.py", "tests/support")

TOY_GROUP = '''
"""A toy buffer group: each request row's KV length, written on the host (pad rows: 0)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from graphrt.buffers import BufferSpec, PadRule, StaticBuffers
from graphrt.metadata.groups import GroupRow
from graphrt.step.batch import Batch


def toy_specs(geometry, dims) -> tuple[BufferSpec, ...]:
    return (BufferSpec("req_len", ("max_bs",), torch.int64, PadRule("const", 0), host=True),)


@dataclass(slots=True)
class ToyBuffers:
    req_len: torch.Tensor


class ToyWriter:
    def write(self, group: StaticBuffers, batch: Batch, rows: int, tokens: int, pad: dict[str, int]) -> bool:
        host = group.next_mirror()["req_len"]
        host[:rows] = 0
        host[: batch.bs] = batch.seq_lens
        return True

    def forget(self) -> None:
        return None


TOY_GROUP = GroupRow(
    "toy",
    toy_specs,
    lambda g: ToyBuffers,
    exists=lambda g: True,
    used_by=lambda mode, g: True,
    writer=lambda g, dims, device: ToyWriter(),
)
'''

#: ``(file, anchor, text put after it)``: the recipes' edits to existing files.
EDITS = (
    # "Add a buffer group", step 2: the row in GROUPS and a StepInputs field
    ("graphrt/metadata/buffer_groups.py", "GROUPS: tuple[GroupRow, ...] = (\n", "    TOY_GROUP,\n"),
    ("graphrt/metadata/buffer_groups.py", "from graphrt.step.batch import Batch\n",
     "from graphrt.metadata.toy import TOY_GROUP, ToyBuffers\n"),
    ("graphrt/metadata/buffer_groups.py", "    step: StepBuffers\n", "    toy: ToyBuffers | None = None\n"),
    # "Add a forward mode", steps 1 and 2: the member, its MODES row, its PROGRAMS row
    ("graphrt/step/modes.py", '    EXTEND = "extend"\n', '    TOY = "toy"\n'),
    ("graphrt/step/modes.py", "MODES: dict[ForwardMode, ModeSpec] = {\n",
     "    ForwardMode.TOY: ModeSpec(graphed=True, ragged=False, tokens=lambda _: 2),\n"),
    ("graphrt/runtime/programs.py", "PROGRAMS: dict[ForwardMode, Program] = {\n",
     "    ForwardMode.TOY: forward_once,\n"),
)  # fmt: skip

SCRIPT = """
import numpy as np, torch
from graphrt import Batch, ForwardMode
from tests.support.util import build_runtime, prefill, slot_of

setup = build_runtime(torch.device("cpu"), modes=(ForwardMode.DECODE, ForwardMode.TOY), buckets=(1, 2, 4),
                      max_batch_size=4, debug=True)
rng = np.random.default_rng(0)
lens = [9, 17, 30]
prefill(setup, [0, 1, 2], lens, rng)
reqs = [2, 0, 1]
batch = Batch.create(
    ForwardMode.TOY,
    input_ids=rng.integers(0, setup.model.vocab_size, 2 * len(reqs)),
    seq_lens=[lens[r] + 2 for r in reqs],
    req_pool_indices=reqs,
    out_cache_loc=[slot_of(setup, r, p) for r in reqs for p in (lens[r], lens[r] + 1)],
    q_lens=[2] * len(reqs),
)
graph = setup.runtime.run(batch)
toy = setup.runtime.groups.group("toy").full["req_len"][:4].tolist()
eager = setup.runtime.run(batch, eager=True)
torch.testing.assert_close(graph, eager, atol=1e-5, rtol=1e-5)
stats = setup.runtime.stats()
print("TOY", toy, graph.shape[0], stats.replays.get("TOY", 0), stats.fallbacks)
"""


def _apply(root: Path) -> None:
    (root / "graphrt/metadata/toy.py").write_text(TOY_GROUP.lstrip())
    for rel, anchor, text in EDITS:
        path = root / rel
        source = path.read_text()
        assert source.count(anchor) == 1, f"{rel}: the recipe's anchor {anchor!r} moved"
        path.write_text(source.replace(anchor, anchor + text))


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("recipes")
    for rel in TREE:
        src, dst = ROOT / rel, root / rel
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, dst)
    _apply(root)
    return root


def test_a_toy_group_and_a_toy_mode_work_from_the_recipes_alone(copy: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(copy))
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT)],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("TOY "))
    # NOTE: rows in batch order (request 2, 0, 1), the pad row by the group's rule; 2 rows of logits
    # per request; one replay, no fallback to eager
    assert line == "TOY [32, 11, 19, 0] 6 1 {}", line

"""DeepSeek-V3.2 (MLA + MoE + the DSA indexer, the ``tiny-deepseek-v3.2`` preset) in every graphed mode.

DECODE, TARGET_VERIFY (chain and token tree), DRAFT_EXTEND (ragged) and DRAFT_DECODE (chain and
tree): replay == eager in full and shrunk buckets, with the debug poison on (every static buffer
poisoned before each update, a poison left after the replay fails); each tree verify token ==
its own path prefilled causally. Contexts reach past ``index_topk`` (16), so keys are dropped.
Float32 on the CPU (the sparse-MLA cache in fp32), bf16 on CUDA.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrt import ForwardMode
from graphrt.models.moe import SparseMoE
from graphrt.step.modes import SpecGeometry
from tests.runtime.spec_checks import check_replay_equals_eager, check_tree_paths, tol
from tests.runtime.test_spec_modes import ROWS, SCRATCH
from tests.support.util import Setup, build_runtime, prefill

M = ForwardMode
MODEL, TOPK, CONTEXT = "tiny-deepseek-v3.2", 16, 64
CHAIN = SpecGeometry(num_steps=3)
TREE = SpecGeometry(num_steps=3, topk=2, num_draft_tokens=5)
_CACHE: dict[tuple[str, SpecGeometry], Setup] = {}


def v32(device: torch.device, spec: SpecGeometry) -> Setup:
    """One captured runtime (every mode, debug poison on) per (device, geometry)."""
    key = (device.type, spec)
    if key not in _CACHE:
        _CACHE[key] = build_runtime(
            device,
            model=MODEL,
            modes=(M.DECODE, M.TARGET_VERIFY, M.DRAFT_EXTEND, M.DRAFT_DECODE),
            speculative=spec,
            buckets=(1, 4),
            max_batch_size=4,
            max_reqs=ROWS + SCRATCH,
            max_context_len=CONTEXT,
            backend=None if device.type == "cuda" else "reference",
            debug=True,
        )
    return _CACHE[key]


def filled(setup: Setup, rng: np.random.Generator) -> list[int]:
    """Prefill rows ``0..ROWS-1`` with lengths on both sides of ``index_topk``."""
    for row in range(ROWS + SCRATCH):
        setup.req_to_token.free(row)
    lens = [int(n) for n in rng.integers(4, CONTEXT - 16, ROWS)]
    lens[0], lens[1] = TOPK - 3, CONTEXT - 16
    prefill(setup, list(range(ROWS)), lens, rng)
    return lens


@pytest.mark.parametrize("spec", [CHAIN, TREE], ids=["chain", "tree"])
def test_every_mode_replay_equals_eager(device: torch.device, spec: SpecGeometry) -> None:
    setup = v32(device, spec)
    assert any(isinstance(layer.mlp, SparseMoE) for layer in setup.model.layers)
    assert setup.kv.index_topk == TOPK and setup.kv.layout == ("bf16" if device.type == "cuda" else "fp32")
    rng = np.random.default_rng(0)
    check_replay_equals_eager(setup, spec, filled(setup, rng), rng, tol(device), decode=True)


def test_tree_verify_equals_each_path_as_chain(device: torch.device) -> None:
    """Each tree token's logits == the last token of its own path, prefilled causally: the
    indexer of a tree token sees its prefix and ancestors only."""
    setup = v32(device, TREE)
    rng = np.random.default_rng(7)
    check_tree_paths(setup, TREE, [1, 3], filled(setup, rng), rng, tol(device))

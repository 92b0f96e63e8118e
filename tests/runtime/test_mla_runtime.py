"""Dense MLA (``tiny-mla``) through GraphRuntime: replay == eager in every mode (DECODE,
TARGET_VERIFY chain and tree, DRAFT_DECODE chain and tree, DRAFT_EXTEND, IDLE), a tree verify
== each path verified causally, a chain draft == DECODE steps, FA3 == the reference (GPU).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrt import Batch, ForwardMode
from graphrt.step.modes import SpecGeometry
from tests.runtime.spec_checks import (
    check_chain_draft,
    check_replay_equals_eager,
    check_tree_paths,
    spec_batches,
    spec_runtime,
    tol,
)
from tests.runtime.test_spec_modes import ROWS, SCRATCH
from tests.support.util import Setup, prefill

M = ForwardMode
CONTEXT = 64
CHAIN = SpecGeometry(num_steps=3)
TREE = SpecGeometry(num_steps=3, topk=2, num_draft_tokens=5)  # token 4 is token 1's sibling
MODES = (M.DECODE, M.TARGET_VERIFY, M.DRAFT_EXTEND, M.DRAFT_DECODE, M.IDLE)
_CACHE: dict[tuple[str, SpecGeometry, str | None], Setup] = {}


def mla(device: torch.device, spec: SpecGeometry, backend: str | None = None) -> Setup:
    """One captured tiny-mla runtime per (device, geometry, backend); tests prefill what they read.

    ``backend`` None: the preferred one (FA3 on an H100, the reference on the CPU).
    """
    key = (device.type, spec, backend)
    if key not in _CACHE:
        _CACHE[key] = spec_runtime(device, "tiny-mla", spec, MODES, CONTEXT, backend=backend)
    return _CACHE[key]


def filled(setup: Setup, rng: np.random.Generator) -> list[int]:
    """Free every row (the runtime is shared), then prefill rows ``0..ROWS-1``."""
    for row in range(ROWS + SCRATCH):
        setup.req_to_token.free(row)
    lens = [int(n) for n in rng.integers(3, CONTEXT // 2, ROWS)]
    prefill(setup, list(range(ROWS)), lens, rng)
    return lens


@pytest.mark.parametrize("spec", [CHAIN, TREE], ids=["chain", "tree"])
def test_every_mode_replay_equals_eager(device: torch.device, spec: SpecGeometry) -> None:
    setup = mla(device, spec)
    rng = np.random.default_rng(0)
    check_replay_equals_eager(setup, spec, filled(setup, rng), rng, tol(device), decode=True)
    idle = Batch.create(M.IDLE, input_ids=[], seq_lens=[], req_pool_indices=[], out_cache_loc=[])
    assert setup.runtime.run(idle).shape[0] == 0
    assert setup.runtime.stats().replays["IDLE"] == 1


def test_tree_verify_equals_each_path_as_chain(device: torch.device) -> None:
    """Each tree token's logits (prefix + expand cascade with ``qv``, merged) == the last token
    of its own path prefilled causally (EXTEND) on a scratch row holding the prefix."""
    setup = mla(device, TREE)
    rng = np.random.default_rng(7)
    check_tree_paths(setup, TREE, [0, 3], filled(setup, rng), rng, tol(device))


def test_chain_draft_equals_greedy_decode_steps(device: torch.device) -> None:
    setup = mla(device, CHAIN)
    rng = np.random.default_rng(11)
    check_chain_draft(setup, CHAIN, [3, 0, 2], filled(setup, rng), rng)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
@pytest.mark.parametrize("spec", [CHAIN, TREE], ids=["chain", "tree"])
def test_fa3_matches_reference(spec: SpecGeometry) -> None:
    """The same weights and batches through FA3 (with ``qv``, graphed) and the reference."""
    pytest.importorskip("sgl_kernel.flash_attn")
    device = torch.device("cuda")
    fa3, ref = mla(device, spec, "fa3"), mla(device, spec, "reference")
    assert fa3.runtime.backend.name == "fa3" and ref.runtime.backend.name == "reference"
    lens = filled(fa3, np.random.default_rng(3))
    assert filled(ref, np.random.default_rng(3)) == lens
    for reqs in ([0, 1, 2, 3], [1]):
        pairs = [
            spec_batches(s, spec, reqs, lens, np.random.default_rng(len(reqs)), True) for s in (fa3, ref)
        ]
        for got, want in zip(*pairs, strict=True):
            if got.mode is M.DRAFT_DECODE:
                continue  # NOTE: argmax tokens: bf16 near-ties may differ; logits are compared
            out = fa3.runtime.run(got)
            torch.testing.assert_close(out, ref.runtime.run(want), **tol(device), msg=f"{reqs} {got.mode}")
    assert fa3.runtime.stats().fallbacks == {}

"""A MoE model in every graphed mode: debug poison proves each routing buffer the mode reads was
rewritten, pad rows hold the pad rules (routing included), and replay equals eager."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrt import ForwardMode
from graphrt.step.modes import SpecGeometry
from tests.runtime.test_spec_modes import ROWS, SCRATCH, draft_batch, filled, verify_batch
from tests.support.util import build_runtime, spec_batch

M = ForwardMode


@pytest.mark.parametrize(
    "spec",
    [SpecGeometry(num_steps=3), SpecGeometry(num_steps=3, topk=2, num_draft_tokens=5)],
    ids=["chain", "tree"],
)
@pytest.mark.parametrize("model", ["tiny-qwen3-moe", "tiny-deepseek-moe"])
def test_every_mode_poison_and_pads(spec: SpecGeometry, model: str) -> None:
    modes = (M.DECODE, M.TARGET_VERIFY, M.DRAFT_EXTEND, M.DRAFT_DECODE)
    setup = build_runtime(
        torch.device("cpu"),
        modes=modes,
        speculative=spec,
        buckets=(1, 2, 4),
        max_batch_size=4,
        max_reqs=ROWS + SCRATCH,
        max_context_len=64,
        model=model,
        debug=True,
    )
    rng = np.random.default_rng(2)
    lens = filled(setup, rng)
    rt = setup.runtime
    routing = rt.groups.group("routing")
    experts = routing.full["expert_counts"].shape[0]
    reqs = [2, 0, 1]
    accept = [int(a) for a in rng.integers(1, 4, len(reqs))]
    for batch in (
        verify_batch(setup, spec, reqs, lens, rng),
        spec_batch(
            setup, M.DRAFT_EXTEND, reqs, [lens[r] + a for r, a in zip(reqs, accept, strict=True)], accept, rng
        ),
        draft_batch(setup, spec, reqs, lens, rng),
    ):
        graphed = rt.run(batch)  # NOTE: debug=True raises PoisonLeft if a buffer kept poison
        eager = rt.run(batch, eager=True)
        torch.testing.assert_close(graphed, eager, atol=1e-4, rtol=1e-4)
        tpr = rt.rows_per_req(batch.mode)
        if batch.mode != M.DRAFT_EXTEND:  # NOTE: ragged: its pad rows start after the real tokens
            assert routing.pad_violations(4, tpr, len(reqs), rt.pad_values(batch.mode)) == [], batch.mode
            assert (routing.view(4, tpr).topk_ids[batch.num_tokens :] == experts).all(), batch.mode
    assert all(
        rt.stats().replays.get(m.name, 0) > 0 for m in (M.TARGET_VERIFY, M.DRAFT_EXTEND, M.DRAFT_DECODE)
    )

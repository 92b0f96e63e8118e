"""Engine with tiny-mla (dense MLA): tokens with graphs == tokens eager; speculative chain and
tree drafts commit exactly plain greedy's tokens."""

from __future__ import annotations

import pytest
import torch

from graphrt import Engine
from tests.engine.draft_checks import check_perturbed_draft

PROMPTS = [[1, 2, 3] * 9, [5, 6, 7, 8], list(range(100, 120))]
KW = {"max_batch_size": 4, "max_context_len": 64, "buckets": (1, 4)}


def test_engine_graphs_match_eager(device: torch.device) -> None:
    outs = []
    for graphs in (True, False):
        engine = Engine("tiny-mla", device=device, use_graphs=graphs, **KW)  # type: ignore[arg-type]
        outs.append(engine.generate(PROMPTS, 6))
        if graphs:
            assert engine.stats().replays["DECODE"] == 5
    assert outs[0] == outs[1]
    assert len({tuple(o) for o in outs[0]}) > 1  # the prompts lead somewhere different


@pytest.mark.parametrize("topk", [1, 2], ids=["chain", "tree"])
def test_speculative_tokens_equal_plain_greedy(topk: int) -> None:
    """A tiny-mla target with a tiny-mla draft whose head is perturbed (sometimes right,
    sometimes wrong): graphed TARGET_VERIFY, DRAFT_DECODE and DRAFT_EXTEND commit exactly
    plain greedy's tokens; a tree's accepted path is moved in the latent cache.

    NOTE: CPU only, as tests/engine/test_engine_spec.py: in bf16 a verify step's logits are not bitwise
    a decode step's, so greedy equality would rest on argmax near-ties.
    """
    plain = Engine("tiny-mla", device="cpu", use_graphs=False, **KW).generate(PROMPTS, 8)  # type: ignore[arg-type]
    spec = {"draft_model": "tiny-mla", "num_steps": 3, "topk": topk}
    engine = Engine("tiny-mla", device="cpu", speculative=spec, **KW)  # type: ignore[arg-type]
    check_perturbed_draft(engine, PROMPTS, 8, plain)

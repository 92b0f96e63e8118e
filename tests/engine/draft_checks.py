"""A speculative engine whose draft is its target with a perturbed head: it commits exactly
plain greedy's tokens. Shared by the DSA and dense-MLA engine tests."""

from __future__ import annotations

import torch

from graphrt import Engine


def check_perturbed_draft(engine: Engine, prompts: list[list[int]], new: int, plain: list[list[int]]) -> None:
    """Perturb ``engine``'s draft head (sometimes right, sometimes wrong: ragged accept lengths),
    generate, and compare with ``plain``; every round graphed (TARGET_VERIFY, DRAFT_DECODE,
    DRAFT_EXTEND), no fallback."""
    head = engine.draft_model.lm_head.weight
    noise = torch.randn(head.shape, generator=torch.Generator().manual_seed(0)) * head.std()
    with torch.no_grad():  # NOTE: graphs read weights in place at replay
        head.add_(noise.to(head.dtype))
    assert engine.generate(prompts, new) == plain
    stats = engine.stats()
    assert 0.0 < stats.acceptance_rate < 1.0, stats.acceptance_rate
    assert stats.replays == {"TARGET_VERIFY": stats.decode_steps} and stats.fallbacks == {}
    assert set(stats.draft_replays) == {"DRAFT_EXTEND", "DRAFT_DECODE"}

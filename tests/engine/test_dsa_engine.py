"""Engine with tiny-dsa: tokens with graphs == tokens eager, both KV layouts."""

from __future__ import annotations

import pytest
import torch

from graphrt import Engine
from tests.engine.draft_checks import check_perturbed_draft

PROMPTS = [[1, 2, 3] * 25, [5, 6, 7, 8], list(range(100, 150))]


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["bf16", "fp8"])
def test_engine_graphs_match_eager(device: torch.device, layout: str) -> None:
    outs = []
    for graphs in (True, False):
        engine = Engine(
            "tiny-dsa",
            device=device,
            use_graphs=graphs,
            max_batch_size=4,
            max_context_len=128,
            buckets=(4,),
            kv_cache_dtype=layout,
        )
        outs.append(engine.generate(PROMPTS, 6))
        if graphs:
            assert engine.stats().replays["DECODE"] == 5
    assert outs[0] == outs[1]
    assert len({tuple(o) for o in outs[0]}) > 1  # the prompts lead somewhere different


def test_engine_rejects_fp8_for_mha() -> None:
    with pytest.raises(
        ValueError, match=r"'fp8' is not one of auto, fp8_e4m3 for an MHA/GQA model \(bf16 \| fp8 are DSA"
    ):
        Engine(
            "tiny-llama",
            device="cpu",
            use_graphs=False,
            max_batch_size=1,
            max_context_len=32,
            kv_cache_dtype="fp8",
        )


@pytest.mark.parametrize("layout", ["bf16", "fp8"])
def test_speculative_dsa_tokens_equal_plain_greedy(layout: str) -> None:
    """A DSA target with a DSA draft (graphed TARGET_VERIFY, DRAFT_DECODE, DRAFT_EXTEND) commits
    exactly plain greedy's tokens. The draft is the target with a perturbed head, so it is
    sometimes right and sometimes wrong (ragged accept lengths).

    NOTE: CPU only, as tests/engine/test_engine_spec.py: in bf16 a verify step's logits are not bitwise
    a decode step's, so greedy equality would rest on argmax near-ties.
    """
    kw = {"device": "cpu", "max_batch_size": 4, "max_context_len": 128, "buckets": (1, 4)}
    plain = Engine("tiny-dsa", use_graphs=False, kv_cache_dtype=layout, **kw).generate(PROMPTS, 8)  # type: ignore[arg-type]
    spec = {"draft_model": "tiny-dsa", "num_steps": 3}
    engine = Engine("tiny-dsa", speculative=spec, kv_cache_dtype=layout, **kw)  # type: ignore[arg-type]
    assert engine.spec is not None and engine.spec.draft.kv.layout == layout
    check_perturbed_draft(engine, PROMPTS, 8, plain)

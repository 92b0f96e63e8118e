"""Engine with tiny-dsa: tokens with graphs == tokens eager, both KV layouts."""

from __future__ import annotations

import pytest
import torch

from graphrt import Engine

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
    with pytest.raises(ValueError, match="DSA presets only"):
        Engine(
            "tiny-llama",
            device="cpu",
            use_graphs=False,
            max_batch_size=1,
            max_context_len=32,
            kv_cache_dtype="fp8",
        )

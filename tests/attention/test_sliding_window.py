"""Sliding-window layers (FA3 ``window_size=(w, 0)``) across the window edge.

A query at position ``p`` sees keys ``p - w … p``. Lengths ``w-1, w, w+1, w+2, 2w`` put the
edge before, on and past the first key; page_size 16 puts it inside a page (w = 24).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrt import ForwardMode
from graphrt.attention import AttendCall, select_backend
from graphrt.models import LlamaConfig, preset
from graphrt.step.modes import SpecGeometry
from tests.support.paged_util import HEAD_DIM, oracle, paged_case, parity_step, tolerance
from tests.support.util import backends, build_runtime, decode_batch, prefill, refill, spec_batch

W = preset("tiny-llama-swa").sliding_window
EDGE = [W - 1, W, W + 1, W + 2, 2 * W, 2 * W + 1]
CONTEXT = 2 * W + 4
MODES = (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("q_lens", [[1] * 6, [1, 4, 2, 4, 3, 4]], ids=["decode", "ragged"])
def test_window_backends_match_oracle(device: torch.device, page_size: int, q_lens: list[int]) -> None:
    case = paged_case(device, page_size, CONTEXT, EDGE, q_lens)
    expected = oracle(case, lambda p: max(0, p - W))
    full = oracle(case, lambda p: 0)
    assert not torch.allclose(expected, full), "no length crosses the window edge"
    atol = tolerance(device)
    for name in backends(device):
        backend = select_backend(name, device)
        out = backend.forward(
            AttendCall(case.q, case.k_cache, case.v_cache, case.meta, HEAD_DIM**-0.5, window=W)
        )
        torch.testing.assert_close(
            out.double().cpu(), expected, atol=atol, rtol=atol, msg=lambda m, n=name: f"{n}: {m}"
        )


def test_window_replay_matches_eager(device: torch.device) -> None:
    """DECODE, TARGET_VERIFY (q_len 4) and DRAFT_EXTEND (ragged) at the window edges, bs < bucket.

    page_size 16 only (the window edge falls inside a page); both page sizes run above.
    """
    page_size = 16
    for backend in backends(device):
        setup = build_runtime(
            device,
            backend=backend,
            model="tiny-llama-swa",
            page_size=page_size,
            max_batch_size=4,
            buckets=(4,),
            max_context_len=CONTEXT,
            max_reqs=6,
            modes=MODES,
            speculative=SpecGeometry(num_steps=3),
        )
        rng = np.random.default_rng(page_size)
        prefill(setup, list(range(6)), [CONTEXT] * 6, rng)
        for lens in ([W - 1, W, W + 1], [W + 2, 2 * W, 2 * W + 1], [W + 3]):
            reqs = [int(r) for r in rng.choice(6, len(lens), replace=False)]
            refill(setup, reqs, CONTEXT)
            parity_step(setup, decode_batch(setup, reqs, lens, rng), device)
            tv = spec_batch(setup, ForwardMode.TARGET_VERIFY, reqs, lens, [4] * len(lens), rng)
            parity_step(setup, tv, device)
            q_lens = [int(q) for q in rng.integers(1, 5, len(lens))]
            parity_step(setup, spec_batch(setup, ForwardMode.DRAFT_EXTEND, reqs, lens, q_lens, rng), device)
        scalars = setup.runtime.dispatcher.graphs[(ForwardMode.DECODE, 4)].info.host_scalars
        assert scalars["layer0.window"] == scalars["layer2.window"] == W
        assert "layer1.window" not in scalars and "layer3.window" not in scalars


def test_window_layers_alternate() -> None:
    cfg = preset("tiny-llama-swa")
    assert [cfg.window(i) for i in range(cfg.num_layers)] == [W, None, W, None]
    assert all(cfg.chunk(i) is None for i in range(cfg.num_layers))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"sliding_window": 0}, "sliding_window must be >= 1.*got 0"),
        ({"attention_chunk_size": -4}, "attention_chunk_size must be >= 1.*got -4"),
        ({"sliding_window": 8, "attention_chunk_size": 16}, "not both"),
        ({"sliding_window": 8, "global_every": 0}, "global_every must be >= 1, got 0"),
    ],
)
def test_bad_window_config(kwargs: dict, match: str) -> None:
    base = dict(vocab_size=8, hidden_size=8, num_layers=1, num_heads=1, num_kv_heads=1, head_dim=8)
    with pytest.raises(ValueError, match=match):
        LlamaConfig(intermediate_size=8, **base, **kwargs)

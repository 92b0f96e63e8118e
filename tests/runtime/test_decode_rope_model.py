"""DECODE through FA3's backend with RoPE + the KV store folded into the split decode kernel
(``GRAPHRT_DECODE_ROPE=1``) against the two-kernel path (``=0``: ``rope_store`` + the kernel).

GPU only (FA3 on Hopper). Two runtimes of the same weights, each captured under its switch, run
the same graphed steps (bs 1 and 3: bucket 4 holds a pad row): the logits agree to the decode
parity tolerance and every layer's KV cache, the dummy slot included, is bit-equal between the
two paths after each step (the fused kernel rotates with ``rope_store``'s own expressions).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrt.attention.split_decode import attend as dk
from tests.support.util import backends, build_runtime, decode_batch, next_lens, prefill

ROWS = [0, 1, 2]


def _fa3() -> bool:
    return torch.cuda.is_available() and "fa3" in backends(torch.device("cuda"))


@pytest.mark.gpu
@pytest.mark.skipif(not _fa3(), reason="needs FA3 on a Hopper GPU")
@pytest.mark.parametrize("page_size", [1, 16])
def test_folded_rope_leaves_the_cache_the_two_kernel_path_leaves(monkeypatch, page_size: int) -> None:
    device = torch.device("cuda")
    setups = {}
    for on in ("0", "1"):
        monkeypatch.setenv(dk.ROPE_ENV, on)
        setups[on] = build_runtime(
            device, backend="fa3", page_size=page_size, max_batch_size=4, max_context_len=96
        )
        prefill(setups[on], ROWS, [5, 40, 70], np.random.default_rng(0))
    for step, rows in enumerate(([0], ROWS, ROWS, [1])):
        logits = {}
        for on, setup in setups.items():
            monkeypatch.setenv(dk.ROPE_ENV, on)
            batch = decode_batch(setup, rows, next_lens(setup, rows), np.random.default_rng(step))
            logits[on] = setup.runtime.run(batch)
            k_after = [t.clone() for t in setup.kv.k]
            assert torch.equal(setup.runtime.run(batch, eager=True), logits[on]), f"{on}: replay != eager"
            assert all(torch.equal(a, b) for a, b in zip(k_after, setup.kv.k, strict=True)), (
                "eager != replay KV"
            )
        torch.testing.assert_close(logits["1"].float(), logits["0"].float(), atol=3e-2, rtol=3e-2)
        for a, b in zip(
            setups["0"].kv.k + setups["0"].kv.v, setups["1"].kv.k + setups["1"].kv.v, strict=True
        ):
            assert torch.equal(a, b), f"step {step}: the caches differ"

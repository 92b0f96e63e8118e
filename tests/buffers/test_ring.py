"""Back-to-back graph steps through the ring of host mirrors, never synchronising, match eager.

On CUDA the host writes step N+1's mirror while step N's copy may still be in flight; a
mirror reused too early would replay a later step's metadata. Compared with an eager twin
(same seed, same steps): every step's logits, the request table and the KV cache.
"""

from __future__ import annotations

import numpy as np
import torch

from tests.runtime.test_decode_parity import tolerance
from tests.support.util import build_runtime, decode_batch, prefill

STEPS = 24
REQS = 8
CONTEXT = 64


def _twins(device: torch.device):
    graph = build_runtime(
        device, max_batch_size=8, buckets=(1, 2, 4, 8), max_context_len=CONTEXT, page_size=16
    )
    eager = build_runtime(
        device, max_batch_size=8, buckets=(1, 2, 4, 8), max_context_len=CONTEXT, page_size=16, capture=False
    )
    for setup in (graph, eager):
        prefill(setup, list(range(REQS)), [8] * REQS, np.random.default_rng(1))
    return graph, eager


def test_back_to_back_steps_match_eager(device: torch.device) -> None:
    graph, eager = _twins(device)
    rng = np.random.default_rng(2)
    lens = [8] * REQS
    batches = []
    for _ in range(STEPS):  # NOTE: batch sizes shrink and grow, so pad rows move every step
        rows = sorted(rng.choice(REQS, int(rng.integers(1, REQS + 1)), replace=False).tolist())
        for r in rows:
            lens[r] += 1
        batches.append(decode_batch(graph, rows, [lens[r] for r in rows], rng))
    out_graph = [graph.runtime.run(b) for b in batches]  # no synchronisation in between
    out_eager = [eager.runtime.run(b, eager=True) for b in batches]
    assert graph.runtime.stats().replays == {"DECODE": STEPS}
    for g, e in zip(out_graph, out_eager, strict=True):
        torch.testing.assert_close(g, e, **tolerance(device))
    assert torch.equal(graph.req_to_token.table, eager.req_to_token.table)
    for layer in range(len(graph.kv.k)):  # NOTE: the last page is the dummy page pad rows write
        torch.testing.assert_close(graph.kv.k[layer][:-1], eager.kv.k[layer][:-1], **tolerance(device))


def test_ring_depth() -> None:
    from graphrt.buffers import StaticBuffers  # noqa: F401 - the ring lives there

    cpu = build_runtime(torch.device("cpu"), max_batch_size=2, buckets=(1, 2), capture=False)
    assert len(cpu.runtime.groups.step.mirrors) == 1  # the CPU copy is synchronous
    if torch.cuda.is_available():
        gpu = build_runtime(torch.device("cuda"), max_batch_size=2, buckets=(1, 2), capture=False)
        step = gpu.runtime.groups.step
        assert (
            len(step.mirrors) == 2
            and step.mirrors[0]["input_ids"].ctypes.data != step.mirrors[1]["input_ids"].ctypes.data
        )

"""The MoE router linear (``moe.Gate``) through the skinny GEMM inside a captured DECODE graph.

A single-row step of a bf16 MoE model: DeepSeek's router keeps float32 weights (the kernel reads
the bf16 ``x`` against them, a float32 output), Qwen3-MoE's runs in bf16. With the skinny GEMM
on, capture records one kernel call per sparse layer for the router, the graph replays what eager
computes bit for bit, and the routed experts (the last layer's routing buffer) and the greedy
token equal those of the torch path (switch off) with logits within :data:`TOLERANCE`.
On the CPU the kernel runs through Triton's interpreter, one program per launch.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrt import Batch, ForwardMode
from graphrt.kernels import prologue as pr
from graphrt.kernels import skinny as sk
from graphrt.kernels.tuning import SkinnyRule
from graphrt.models.moe import SparseMoE
from tests.support.triton_util import triton_devices
from tests.support.tuning_util import patch_tuning
from tests.support.util import build_runtime, prefill, slot_of

#: Largest relative difference (max |difference| / max |logit|) between the logits with the
#: skinny GEMM on and off: bf16 activations round the same fp32 sums at other places.
TOLERANCE = 2**-5


def _step(setup, token: int, seq_len: int) -> Batch:
    return Batch.create(
        ForwardMode.DECODE, input_ids=[token], seq_lens=[seq_len], req_pool_indices=[0],
        out_cache_loc=[slot_of(setup, 0, seq_len - 1)],
    )  # fmt: skip


@pytest.mark.parametrize("device", triton_devices())
@pytest.mark.parametrize(
    ("model", "router"), [("tiny-deepseek-moe", torch.float32), ("tiny-qwen3-moe", torch.bfloat16)]
)
def test_router_takes_the_kernel_in_a_decode_graph(device, model, router, monkeypatch) -> None:
    if device.type == "cpu":  # NOTE: interpreted programs are slow: one program per launch
        patch_tuning(monkeypatch, skinny_rules=(SkinnyRule(64, 1 << 62, sk.Tile(1024, 512)),))
    monkeypatch.setenv(sk.ENV, "interpret" if device.type == "cpu" else "1")
    # NOTE: the router alone: with the fused prologue on (the GPU's default) the MLP norm and the
    # router are one norm_keep_linear launch instead (tests/models/test_prologue_keep.py)
    monkeypatch.setenv(pr.ENV, "0")
    calls: list[tuple[torch.dtype, int]] = []
    kernel = sk.skinny_linear
    monkeypatch.setattr(
        sk, "skinny_linear", lambda *a, **kw: calls.append((a[1].dtype, a[1].shape[0])) or kernel(*a, **kw)
    )
    setup = build_runtime(
        device, model=model, dtype=torch.bfloat16, buckets=(1,), max_batch_size=1, max_reqs=1
    )
    sparse = [m for m in setup.model.modules() if isinstance(m, SparseMoE)]
    assert sparse and all(m.gate.weight.dtype == router for m in sparse)
    experts = sparse[0].spec.num_experts
    prefill(setup, [0], [20], np.random.default_rng(0))
    routing = setup.runtime.groups.group("routing").view(1, 1)
    batch = _step(setup, 7, 21)
    graphed = setup.runtime.run(batch)
    ids = routing.topk_ids[:1].clone()
    calls.clear()
    assert torch.equal(graphed, setup.runtime.run(batch, eager=True)), "replay differs from eager"
    assert calls.count((router, experts)) == len(sparse), calls  # NOTE: one router call per sparse layer
    monkeypatch.setenv(sk.ENV, "0")
    count = len(calls)
    torch_path = setup.runtime.run(batch, eager=True)
    assert len(calls) == count, "the switch-off step called the kernel"
    assert torch.equal(routing.topk_ids[:1], ids), "the routed experts changed"
    peak = ((graphed.float() - torch_path.float()).abs().max() / torch_path.float().abs().max()).item()
    assert peak <= TOLERANCE, f"kernel vs torch logits: relative max {peak:.3g}"
    assert torch.equal(graphed.argmax(-1), torch_path.argmax(-1))

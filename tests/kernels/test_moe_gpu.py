"""The fused expert kernels on the GPU at the real shapes (bf16), in a CUDA graph replayed with
new routing, and the alignment against sgl-kernel's ``moe_align_block_size``. All ``-m gpu``."""

from __future__ import annotations

import functools

import pytest
import torch

from graphrt.kernels.moe import BLOCK_M, ExpertWeights, experts_reference, fused_experts, new_routing
from graphrt.kernels.moe import align as al
from graphrt.kernels.moe import triton_experts as te
from tests.support.moe_util import random_experts, random_ids

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")]

#: ``name: (E, k, H, I, activation, biases)``.
SHAPES = {
    "qwen3-30b-a3b": (128, 8, 2048, 768, "silu", False),
    "gpt-oss-20b": (32, 4, 2880, 2880, "swiglu_clamp", True),
    "deepseek-v2-lite": (64, 6, 2048, 1408, "silu", False),
}
#: Relative L2 error against the fp32 reference: bf16 rounds ``inter`` and the output (~4e-3).
AGREE = 1e-2


@functools.cache
def _weights(name: str) -> ExpertWeights:
    experts, _, hidden, inter, act, bias = SHAPES[name]
    dev = torch.device("cuda")
    return random_experts(experts, hidden, inter, bias=bias, activation=act, dtype=torch.bfloat16, device=dev)


def _layer(name: str, tokens: int, pads: tuple[int, ...] = (), seed: int = 0):
    experts, topk, hidden = SHAPES[name][:3]
    dev = torch.device("cuda")
    ids = random_ids(tokens, topk, experts, pad_rows=pads, seed=seed + tokens).to(dev)
    weights = torch.rand(tokens, topk, generator=torch.Generator().manual_seed(seed)).to(dev)
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(seed + 1)).to(dev, torch.bfloat16)
    return x, _weights(name), new_routing(ids, weights, experts)


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-6))


@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("tokens", [1, 4, 16, 64])
def test_real_shapes_match_reference(name: str, tokens: int) -> None:
    pads = (tokens - 1,) if tokens > 1 else ()
    x, w, routing = _layer(name, tokens, pads)
    got = fused_experts(x, w, routing)
    want = experts_reference(x, w, routing.topk_ids, routing.topk_weights)
    real = [t for t in range(tokens) if t not in pads]
    assert _rel(got[real], want[real]) < AGREE
    assert not got[list(pads)].any(), "pad rows add nothing"


@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("tokens", [1, 4])
def test_skinny_and_grouped_paths_agree(name: str, tokens: int, monkeypatch) -> None:
    x, w, routing = _layer(name, tokens)
    skinny = fused_experts(x, w, routing)
    assert _rel(te.fused_experts_triton(x, w, routing, skinny_slots=0), skinny) < AGREE


@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("tokens", [1, 16, 64])
def test_graph_replays_with_new_routing(name: str, tokens: int) -> None:
    """Captured once (PDL where the GPU has it); three new routings and inputs copied into the same
    buffers: each replay equals the eager call bit for bit and the reference within bf16."""
    x, w, routing = _layer(name, tokens)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fused_experts(x, w, routing)  # NOTE: compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = fused_experts(x, w, routing)
    for seed in range(1, 4):
        pads = (seed % tokens,) if tokens > 1 else ()
        new_x, _, new = _layer(name, tokens, pads, seed=seed)
        x.copy_(new_x)
        routing.topk_ids.copy_(new.topk_ids)
        routing.topk_weights.copy_(new.topk_weights)
        graph.replay()
        torch.cuda.synchronize()
        eager = fused_experts(x, w, routing)
        assert torch.equal(out, eager), f"replay {seed} differs from eager"
        want = experts_reference(x, w, routing.topk_ids, routing.topk_weights)
        assert _rel(out, want) < AGREE and not out[list(pads)].any()


@pytest.mark.parametrize(("tokens", "topk", "experts"), [(1, 8, 128), (16, 8, 128), (64, 4, 32), (64, 6, 64)])
def test_alignment_agrees_with_sgl_kernel(tokens: int, topk: int, experts: int) -> None:
    """sgl-kernel's ``moe_align_block_size`` over ``E + 1`` experts (the pad rows' id ``E`` as one
    more expert: it has no notion of a dropped slot) holds the same slots per expert in the same
    number of blocks; only the order within an expert may differ (its counting is atomic)."""
    sgl = pytest.importorskip("sgl_kernel")
    ids = random_ids(tokens, topk, experts, pad_rows=(0,) if tokens > 1 else (), seed=tokens).cuda()
    ours = new_routing(ids, ids.float(), experts)
    al.moe_align(ids, experts, ours)
    bound = ids.numel() + (experts + 1) * (BLOCK_M - 1)
    sorted_ids = torch.full((bound,), ids.numel(), dtype=torch.int32, device="cuda")
    blocks = torch.empty(-(-bound // BLOCK_M), dtype=torch.int32, device="cuda")
    padded = torch.empty(1, dtype=torch.int32, device="cuda")
    cumsum = torch.zeros(experts + 2, dtype=torch.int32, device="cuda")
    args = (ids, experts + 1, BLOCK_M, sorted_ids, blocks, padded, cumsum)
    try:
        sgl.moe_align_block_size(*args, True)  # NOTE: pad_sorted_token_ids (newer releases)
    except TypeError:
        sgl.moe_align_block_size(*args)
    n_sgl, n_ours = int(padded), int(ours.num_padded)
    for e in range(experts):
        theirs = sorted_ids[:n_sgl].view(-1, BLOCK_M)[blocks[: n_sgl // BLOCK_M] == e]
        mine = ours.sorted_ids[:n_ours].view(-1, BLOCK_M)[ours.block_experts[: n_ours // BLOCK_M] == e]
        assert theirs.shape == mine.shape, e
        assert sorted(theirs.flatten().tolist()) == sorted(mine.flatten().tolist()), e

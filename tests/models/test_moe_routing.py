"""MoE routing: the routers equal transformers', the alignment equals its definition, pad rows
route to no expert, and the routing buffers are declared, poisoned and reported like any group."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from graphrt import ForwardMode
from graphrt.cli import main
from graphrt.debug.snapshot import take_snapshot
from graphrt.kernels.moe import BLOCK_M, Routing, align_bound, block_bound
from graphrt.kernels.moe.align import align_reference
from graphrt.metadata.routing import RoutingShape
from graphrt.models.moe_config import MoESpec
from graphrt.models.router import route
from tests.support.util import build_runtime, decode_batch, prefill

transformers = pytest.importorskip("transformers")

H, E = 32, 8


def _router(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
        bias = getattr(module, "e_score_correction_bias", None)
        if bias is not None:
            bias.copy_(torch.randn(bias.shape, generator=gen) * 0.3)
    return module


ROUTERS = {
    # id: (transformers router, its config kwargs, our spec)
    "qwen2-softmax": (
        "qwen2_moe.modeling_qwen2_moe.Qwen2MoeTopKRouter",
        ("Qwen2MoeConfig", dict(num_experts=E, num_experts_per_tok=3, norm_topk_prob=False)),
        MoESpec(E, 3, 16, (True,)),
    ),
    "deepseek-v2-group-limited": (
        "deepseek_v2.modeling_deepseek_v2.DeepseekV2TopkRouter",
        (
            "DeepseekV2Config",
            dict(
                n_routed_experts=E,
                num_experts_per_tok=3,
                topk_method="group_limited_greedy",
                n_group=4,
                topk_group=2,
                routed_scaling_factor=1.5,
            ),
        ),
        MoESpec(
            E, 3, 16, (True,), scoring="group_limited", n_group=4, topk_group=2, routed_scaling_factor=1.5
        ),
    ),
    "deepseek-v3-sigmoid": (
        "deepseek_v3.modeling_deepseek_v3.DeepseekV3TopkRouter",
        (
            "DeepseekV3Config",
            dict(
                n_routed_experts=E,
                num_experts_per_tok=3,
                n_group=4,
                topk_group=2,
                routed_scaling_factor=2.5,
                norm_topk_prob=True,
            ),
        ),
        MoESpec(
            E,
            3,
            16,
            (True,),
            scoring="sigmoid",
            norm_topk_prob=True,
            n_group=4,
            topk_group=2,
            routed_scaling_factor=2.5,
            score_bias=True,
        ),
    ),
    "gpt-oss-topk-softmax": (
        "gpt_oss.modeling_gpt_oss.GptOssTopKRouter",
        ("GptOssConfig", dict(num_local_experts=E, num_experts_per_tok=3)),
        MoESpec(E, 3, 16, (True,), scoring="topk_softmax", router_bias=True),
    ),
}


@pytest.mark.parametrize("case", list(ROUTERS))
def test_router_equals_transformers(case: str) -> None:
    """Same experts (as sets per token) and the same weights per expert, fp32."""
    import importlib

    path, (config_cls, kwargs), spec = ROUTERS[case]
    module, cls = path.rsplit(".", 1)
    config = getattr(transformers, config_cls)(hidden_size=H, **kwargs)
    ref = _router(getattr(importlib.import_module(f"transformers.models.{module}"), cls)(config), 0)
    x = torch.randn(64, H, generator=torch.Generator().manual_seed(1))
    want_w, want_ids = ref(x)[1:]
    bias = getattr(ref, "bias", None)
    logits = torch.nn.functional.linear(x, ref.weight, bias if spec.router_bias else None)
    weights, ids = route(logits, spec, getattr(ref, "e_score_correction_bias", None))
    dense = torch.zeros(64, E).scatter_(1, ids, weights)
    want = torch.zeros(64, E).scatter_(1, want_ids.long(), want_w.float())
    torch.testing.assert_close(dense, want, atol=1e-6, rtol=1e-5)


def _routing(tokens: int, topk: int, experts: int, ids: torch.Tensor) -> Routing:
    poison = -7
    return Routing(
        ids.int(),
        torch.ones(tokens, topk),
        torch.full((align_bound(tokens, topk, experts),), poison, dtype=torch.int32),
        torch.full((block_bound(tokens, topk, experts),), poison, dtype=torch.int32),
        torch.full((1,), poison, dtype=torch.int32),
        torch.full((experts,), poison, dtype=torch.int32),
    )


@pytest.mark.parametrize(("tokens", "topk", "experts"), [(1, 2, 8), (5, 3, 4), (13, 4, 64)])
def test_align_reference_layout(tokens: int, topk: int, experts: int) -> None:
    """Slots grouped by expert in slot order, runs padded to BLOCK_M with ``T * k``, each block's
    expert, -1 past the end; pad rows (id ``num_experts``) in no run."""
    gen = torch.Generator().manual_seed(tokens)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:topk] for _ in range(tokens)])
    ids[-1] = experts  # NOTE: the last row is a pad row
    r = _routing(tokens, topk, experts, ids)
    align_reference(r.topk_ids, experts, r)
    flat, runs, blocks = ids.reshape(-1).tolist(), [], []
    for e in range(experts):
        run = [s for s, x in enumerate(flat) if x == e]
        if run:
            run += [tokens * topk] * (-len(run) % BLOCK_M)
            runs += run
            blocks += [e] * (len(run) // BLOCK_M)
    n = len(runs)
    assert int(r.num_padded) == n and r.sorted_ids[:n].tolist() == runs
    assert r.block_experts.tolist() == blocks + [-1] * (r.block_experts.numel() - len(blocks))
    assert r.expert_counts.tolist() == [flat.count(e) for e in range(experts)]
    assert (r.sorted_ids[n:] == tokens * topk).all()


def moe_setup(**kw: object):
    return build_runtime(
        torch.device("cpu"),
        buckets=(1, 2, 4),
        max_batch_size=4,
        max_context_len=64,
        model="tiny-qwen3-moe",
        **kw,
    )


def test_pad_rows_route_to_no_expert(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A bucket of 4 holding 3 requests: row 3 routes to expert ``num_experts`` with weight 0;
    the real rows to real experts. The group is in the memory report, the snapshot and inspect."""
    setup = moe_setup()
    rt, rng = setup.runtime, np.random.default_rng(0)
    assert setup.model.routing_shape() == RoutingShape(8, 2)
    prefill(setup, range(3), [5, 9, 3], rng)
    rt.run(decode_batch(setup, [0, 1, 2], [6, 10, 4], rng))
    assert rt.stats().replays["DECODE"] == 1
    group = rt.groups.group("routing")
    view = group.view(4)
    assert view.topk_ids[3].tolist() == [8, 8] and view.topk_weights[3].tolist() == [0.0, 0.0]
    assert (view.topk_ids[:3] < 8).all() and int(view.num_tokens) == 3
    assert group.pad_violations(4, 1, 3, rt.pad_values(ForwardMode.DECODE)) == []
    names = {r.group: [row.name for row in r.rows] for r in rt.groups.memory_reports()}
    assert names["routing"][:3] == ["num_tokens", "topk_ids", "topk_weights"]
    path = tmp_path / "snap.json"
    take_snapshot(rt, str(path), environment={"device": "cpu"})
    assert main(["inspect", str(path), "--width", "160"]) == 0
    out = capsys.readouterr().out
    assert "topk_ids" in out and "expert_counts" in out

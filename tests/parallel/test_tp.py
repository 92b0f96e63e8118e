"""Tensor parallelism on CPU ranks (gloo): sharded presets, every graphed mode vs TP=1, the engine.

Tolerance: fp32 logits of TP=2/4 within ``ATOL`` of TP=1 (only the row-parallel all-reduce
changes the summation order), greedy tokens and draft tokens equal.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from graphrt import ForwardMode
from graphrt.models import TinyLlama, preset
from graphrt.models.parallel import kv_heads
from graphrt.parallel import Message, Op, TPGroup, init_tp, pack, unpack
from graphrt.step.modes import SpecGeometry
from tests.runtime.test_spec_modes import draft_batch, filled, setup_for, verify_batch
from tests.support.tp_util import run_ranks
from tests.support.util import decode_batch, spec_batch

M = ForwardMode
ATOL = 1e-4
CPU = torch.device("cpu")


def mode_outputs(rank: int, world: int, device: str = "cpu") -> dict:
    """Every graphed mode on TP=world (graph and eager) and on a local TP=1 copy; max diffs."""
    group = init_tp(world, torch.device(device))
    dev = group.device
    spec = SpecGeometry(num_steps=3)
    ref, tp = setup_for(dev, spec), setup_for(dev, spec, tp=group)
    rng_ref, rng_tp = np.random.default_rng(7), np.random.default_rng(7)
    lens = filled(ref, rng_ref)
    assert filled(tp, rng_tp) == lens
    rng = np.random.default_rng(1)
    reqs = [0, 2, 5]
    batches = {
        M.DECODE: decode_batch(tp, reqs, [lens[r] + 1 for r in reqs], rng),
        M.TARGET_VERIFY: verify_batch(tp, spec, reqs, lens, rng),
        M.DRAFT_DECODE: draft_batch(tp, spec, reqs, lens, rng),
        M.DRAFT_EXTEND: spec_batch(tp, M.DRAFT_EXTEND, reqs, [lens[r] + 2 for r in reqs], [2, 1, 2], rng),
    }
    found: dict = {}
    for mode, batch in batches.items():
        want = ref.runtime.run(batch)
        graph, eager = tp.runtime.run(batch), tp.runtime.run(batch, eager=True)
        assert graph.shape == want.shape, (mode, graph.shape, want.shape)
        if mode is M.DRAFT_DECODE:  # draft tokens
            found[mode.name] = (bool(torch.equal(graph, want)), bool(torch.equal(eager, want)), 0.0, 0.0)
            continue
        same = bool(torch.equal(graph.argmax(-1), want.argmax(-1)))
        diff = max((graph - want).abs().max().item(), (eager - want).abs().max().item())
        replay = (graph - eager).abs().max().item()
        found[mode.name] = (same, bool(torch.equal(eager.argmax(-1), want.argmax(-1))), diff, replay)
    idle = tp.runtime.run(spec_batch(tp, M.IDLE, [], [], [], rng))
    found["IDLE"] = (idle.shape[0] == 0, True, 0.0, 0.0)
    stats = tp.runtime.stats()
    found["stats"] = (stats.replays, stats.eager, stats.fallbacks)
    found["kernels"] = sorted(
        {k.name for g in tp.runtime.dispatcher.graphs.values() for k in g.info.kernels}
        & {"all_reduce_", "all_gather"}
    )
    return found


@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_every_graphed_mode_matches_tp1(world: int) -> None:
    results = run_ranks(mode_outputs, world, deadline_s=420)
    for rank, found in enumerate(results):
        assert found["kernels"] == ["all_gather", "all_reduce_"], (
            f"rank {rank}: collectives not in the graphs"
        )
        for mode in ("DECODE", "TARGET_VERIFY", "DRAFT_DECODE", "DRAFT_EXTEND", "IDLE"):
            graph_same, eager_same, diff, _ = found[mode]
            assert graph_same and eager_same, f"rank {rank} {mode}: tokens differ from TP=1"
            assert diff <= ATOL, f"rank {rank} {mode}: |logits - TP=1| = {diff} > {ATOL}"
    assert all(r["stats"] == results[0]["stats"] for r in results), "ranks took different paths"


def engine_tokens(
    rank: int,
    world: int,
    speculative: dict | None,
    device: str = "cpu",
    sampling: dict | None = None,
    overlap: bool | None = None,
) -> tuple:
    from graphrt import Engine, SamplingParams
    from graphrt.parallel import shutdown

    prompts = [[1, 2, 3], [7, 8, 9, 10, 11], [100]] if rank == 0 else [[5]]  # NOTE: rank 0's win
    params = SamplingParams(**sampling) if sampling else None
    mine = params if rank == 0 else SamplingParams(0.3, seed=1)  # NOTE: rank 0's sampling wins too
    kw = dict(device=device, max_batch_size=4, max_context_len=48, speculative=speculative, buckets=(2, 4))
    engine = Engine("tiny-llama", tp=world, overlap=overlap, **kw)
    assert (engine.overlap is not None) == bool(overlap), "overlap is opt-in with tp > 1"
    out = engine.generate(prompts, 5, mine if sampling else None)
    stats = engine.stats()
    engine.close()
    shutdown()
    kw["device"] = engine.device
    ref = Engine("tiny-llama", **kw).generate([[1, 2, 3], [7, 8, 9, 10, 11], [100]], 5, params)
    return out, ref, stats.replays, stats.fallbacks


SAMPLED = {"temperature": 0.9, "top_p": 0.95, "seed": 11}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("speculative", "sampling", "overlap"),
    [
        (None, None, None),
        ({"num_steps": 3}, None, None),
        (None, SAMPLED, None),
        (None, None, True),
        (None, SAMPLED, True),
    ],
    ids=["greedy", "speculative", "sampled", "overlap", "overlap-sampled"],
)
def test_engine_tp2_tokens_equal_tp1_and_exits(
    speculative: dict | None, sampling: dict | None, overlap: bool | None
) -> None:
    results = run_ranks(engine_tokens, 2, speculative, "cpu", sampling, overlap, deadline_s=420, exit_s=20)
    for rank, (out, ref, replays, _) in enumerate(results):
        assert out == ref, f"rank {rank}: TP=2 tokens differ from TP=1"
        assert sum(replays.values()) > 0
    assert results[0][2:] == results[1][2:]


@pytest.mark.slow
def test_torchrun_demo_prints_once_and_exits() -> None:
    # NOTE: on the CPU over gloo, whatever GPUs the machine has (one-GPU boxes included)
    cmd = [  # NOTE: this interpreter's torchrun, so the checkout under test runs (not a PATH one)
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "-m",
        "graphrt",
        "demo",
        "--tp",
        "2",
        "--prompts",
        "3",
        "--device",
        "cpu",
    ]
    cmd += ["--max-new-tokens", "4", "--max-batch-size", "4", "--max-context-len", "128"]
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, env=os.environ | {"OMP_NUM_THREADS": "1"}
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("graphrt demo:") == 1  # rank 0 only
    assert "tokens identical" in done.stdout and "2 rank(s)" in done.stdout


def test_tp_size_that_does_not_divide_heads_is_refused() -> None:
    cfg = preset("tiny-llama")  # 4 heads, 2 KV heads
    with pytest.raises(ValueError, match=r"tensor-parallel size 3 does not divide num_heads 4"):
        TinyLlama(cfg, TPGroup(rank=0, size=3))
    with pytest.raises(ValueError, match=r"tensor-parallel size 8 does not divide num_heads 4"):
        TinyLlama(cfg, TPGroup(rank=0, size=8))


def test_kv_heads_split_or_replicated() -> None:
    assert [kv_heads(2, 4, TPGroup(rank=r, size=2)).start for r in range(2)] == [0, 1]
    assert [kv_heads(2, 4, TPGroup(rank=r, size=4)).start for r in range(4)] == [0, 0, 1, 1]
    assert {kv_heads(2, 4, TPGroup(rank=r, size=4)).size for r in range(4)} == {1}
    with pytest.raises(ValueError, match="does not divide num_kv_heads 3"):
        kv_heads(3, 12, TPGroup(rank=0, size=4))


def test_tp_without_process_group_says_how_to_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(ValueError, match="torchrun --nproc-per-node 2"):
        init_tp(2, CPU)


def test_weight_loader_narrows_full_and_fused_parts() -> None:
    cfg = preset("tiny-llama")
    full = TinyLlama.from_seed(cfg, 0, CPU, torch.float32)
    shard = TinyLlama(cfg, TPGroup(rank=1, size=2))
    qkv = shard.layers[0].attn.qkv.weight
    w = full.layers[0].attn.qkv.weight.detach()
    q, k, v = w.split((256, 128, 128))
    for name, block in zip("qkv", (q, k, v), strict=True):
        qkv.weight_loader(qkv, block, name)  # a checkpoint's q_proj / k_proj / v_proj
    assert torch.equal(qkv, torch.cat((q[128:], k[64:], v[64:])))
    shard.layers[0].attn.qkv.weight.weight_loader(qkv, w)  # the fused tensor at once
    assert torch.equal(qkv, torch.cat((q[128:], k[64:], v[64:])))
    down = shard.layers[0].mlp.down.weight
    down.weight_loader(down, full.layers[0].mlp.down.weight.detach())
    assert torch.equal(down, full.layers[0].mlp.down.weight[:, 256:])


def test_step_message_round_trip() -> None:
    from graphrt.metadata.cascade import chain_tree_mask
    from graphrt.step.batch import Batch

    mask = np.broadcast_to(chain_tree_mask(2, 2, 5), (2, 5, 5)).copy()
    batch = Batch.create(
        M.TARGET_VERIFY,
        input_ids=np.arange(10),
        seq_lens=[9, 12],
        req_pool_indices=[3, 1],
        out_cache_loc=np.arange(20, 30),
        q_lens=[5, 5],
        tree_mask=mask,
    )
    got = unpack(pack(Message(Op.RUN, 1, True, batch)))
    assert (got.op, got.target, got.eager, got.batch.mode) == (Op.RUN, 1, True, M.TARGET_VERIFY)
    for name in ("input_ids", "seq_lens", "req_pool_indices", "out_cache_loc", "q_lens", "tree_mask"):
        assert np.array_equal(getattr(got.batch, name), getattr(batch, name)), name
    assert got.batch.sampling is None
    assert unpack(pack(Message(Op.STOP))).batch is None


def test_step_message_carries_sampling() -> None:
    from graphrt.step.batch import Batch
    from graphrt.step.sampling import SamplingParams

    params = (
        SamplingParams(0.7, 40, 0.9, 0.05, seed=2**63 - 1),
        SamplingParams(),
        SamplingParams(1.3, seed=0),
    )
    batch = Batch.create(
        M.DECODE,
        input_ids=[4, 5, 6],
        seq_lens=[3, 8, 2],
        req_pool_indices=[0, 2, 1],
        out_cache_loc=[7, 9, 11],
        sampling=params,
    )
    got = unpack(pack(Message(Op.RUN, 0, False, batch))).batch
    assert got.sampling == params  # NOTE: floats travel as their bits: equal, not close
    assert np.array_equal(got.out_cache_loc, batch.out_cache_loc)


def test_unknown_all_reduce_path_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from graphrt.parallel.ops import Communicator

    monkeypatch.setenv("GRAPHRT_ALLREDUCE", "multimem")
    with pytest.raises(
        ValueError, match=r"GRAPHRT_ALLREDUCE=.multimem.: expected one of nccl, auto, oneshot, p2p"
    ):
        Communicator(TPGroup(size=2))

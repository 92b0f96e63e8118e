"""TP on two GPUs (NCCL): graphed modes vs TP=1, the one-shot all-reduce in a graph, a clean exit.

Marked ``gpu``; skipped without two CUDA devices. bf16: TP=2 logits within ``ATOL_BF16`` of
TP=1, graph replay equal to the eager step on each rank.
"""

from __future__ import annotations

import pytest
import torch

from tests.parallel.test_tp import SAMPLED, engine_tokens, mode_outputs
from tests.support.tp_util import run_ranks

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices"),
]
ATOL_BF16 = 0.1


def test_every_graphed_mode_tp2_cuda() -> None:
    results = run_ranks(mode_outputs, 2, "cuda", backend="nccl", timeout_s=120, deadline_s=600)
    for rank, found in enumerate(results):
        for mode in ("DECODE", "TARGET_VERIFY", "DRAFT_EXTEND"):
            _, _, diff, replay = found[mode]
            assert diff <= ATOL_BF16, f"rank {rank} {mode}: |TP2 - TP1| = {diff}"
            assert replay <= 2e-2, f"rank {rank} {mode}: |graph - eager| = {replay}"
    assert results[0]["stats"] == results[1]["stats"]


def _oneshot_in_graph(rank: int, world: int) -> tuple[bool, bool, float]:
    import os

    import torch.distributed as dist

    from graphrt.parallel import init_tp
    from graphrt.parallel.ops import communicator

    os.environ["GRAPHRT_ALLREDUCE"] = (
        "oneshot"  # NOTE: torch's one-shot by name (the default is p2p); read by init_tp
    )
    group = init_tp(world, torch.device("cuda"))
    comm = communicator(group.name)
    assert type(comm.small).__name__ == "OneShot", "one-shot path unavailable"
    x = torch.zeros(4096, dtype=torch.bfloat16, device=group.device)  # 8 KB
    stream = torch.cuda.Stream(group.device)
    with torch.cuda.stream(stream):
        comm.small.all_reduce_(x)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        torch.ops.graphrt.all_reduce_(x, group.name)
    x.copy_(torch.randn(4096, generator=torch.Generator().manual_seed(rank)).bfloat16().to(group.device))
    want = x.clone()
    dist.all_reduce(want, group=group.device_group)
    graph.replay()
    torch.cuda.synchronize()
    both = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(both, x, group=group.device_group)
    graph.reset()
    return (
        bool(torch.equal(x, want)),
        bool(torch.equal(both[0], both[1])),
        (x.float() - want.float()).abs().max().item(),
    )


def test_oneshot_all_reduce_in_a_graph_is_exact_and_identical() -> None:
    for equal_nccl, identical, diff in run_ranks(_oneshot_in_graph, 2, backend="nccl", timeout_s=60):
        assert identical, "ranks got different sums"
        assert equal_nccl, f"one-shot differs from NCCL by {diff}"


@pytest.mark.parametrize(
    ("speculative", "sampling", "overlap"),
    [(None, None, None), ({"num_steps": 3}, None, None), (None, SAMPLED, None), (None, SAMPLED, True)],
    ids=["greedy", "speculative", "sampled", "overlap-sampled"],
)
def test_engine_tp2_cuda_runs_and_exits_on_its_own(
    speculative: dict | None, sampling: dict | None, overlap: bool | None
) -> None:
    """Every rank returns rank 0's tokens and the processes exit; bf16 tokens are not compared
    with TP=1 (a near-tie may flip under another summation order)."""
    results = run_ranks(
        engine_tokens,
        2,
        speculative,
        "cuda",
        sampling,
        overlap,
        backend="nccl",
        timeout_s=120,
        deadline_s=600,
        exit_s=60,
    )
    assert results[0][0] == results[1][0]
    assert sum(results[0][2].values()) > 0

"""The p2p all-reduce (``GRAPHRT_ALLREDUCE=p2p``) on two GPUs: exact sums, eager and graphed, and a
decode model's logits equal to NCCL's.

Marked ``gpu``; skipped without two CUDA devices. Exact: every sum equals :func:`reference_sum`
of every rank's input (rank order, fp32, one rounding) bit for bit, on every rank. With two
ranks that is also NCCL's sum (one correctly rounded addition), so the model's logits match
NCCL's bit for bit.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from tests.support.tp_util import run_ranks

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices"),
]
#: bf16 message bytes: 2 KB ... 256 KB, and 3001 elements (not a multiple of a program's 1024
#: elements, nor of a 16-byte vector).
SIZES = (2048, 8192, 65536, 262144, 6002)
PER_GRAPH = 32


def _exact(group, xs: list[torch.Tensor], inputs: list[torch.Tensor]) -> tuple[bool, bool]:
    """(every ``x`` equals the reference sum of every rank's input, every rank got the same bits)."""
    import torch.distributed as dist

    from graphrt.parallel.p2p import reference_sum

    exact = identical = True
    for x, inp in zip(xs, inputs, strict=True):
        parts = [torch.empty_like(inp) for _ in range(group.size)]
        dist.all_gather(parts, inp, group=group.device_group)
        exact &= bool(torch.equal(x, reference_sum(parts)))
        outs = [torch.empty_like(x) for _ in range(group.size)]
        dist.all_gather(outs, x, group=group.device_group)
        identical &= all(torch.equal(o, outs[0]) for o in outs)
    return exact, identical


def _sums(rank: int, world: int) -> dict[str, tuple[bool, bool]]:
    from graphrt.parallel import init_tp
    from graphrt.parallel.ops import communicator

    os.environ["GRAPHRT_ALLREDUCE"] = "p2p"  # NOTE: read by init_tp
    group = init_tp(world, torch.device("cuda"))
    comm, dev = communicator(group.name), group.device
    assert type(comm.small).__name__ == "PeerSum", f"p2p path not set up: {comm.small!r}"
    gen = torch.Generator(dev).manual_seed(100 + rank)

    def fresh(xs: list[torch.Tensor]) -> list[torch.Tensor]:
        for x in xs:
            x.copy_(torch.randn(x.shape, generator=gen, device=dev))
        return [x.clone() for x in xs]

    found: dict[str, tuple[bool, bool]] = {}
    cases = [(n, torch.bfloat16) for n in SIZES] + [(8192, torch.float16), (8192, torch.float32)]
    for nbytes, dtype in cases:
        x = torch.empty(nbytes // dtype.itemsize, dtype=dtype, device=dev)
        inputs = fresh([x])
        comm.small.all_reduce_(x)
        found[f"eager {nbytes} B {dtype}"] = _exact(group, [x], inputs)
    big = torch.empty(2 * 262144 // 2, dtype=torch.bfloat16, device=dev)  # past the limit: NCCL
    inputs = fresh([big])
    assert not comm.small.fits(big)
    comm.all_reduce_(big)
    found["nccl fallback 512 KiB"] = _exact(group, [big], inputs)
    found.update(_graphed(group, fresh))
    return found


def _graphed(group, fresh) -> dict[str, tuple[bool, bool]]:
    """32 sums in one graph through the op, sizes cycling (programs drop out and come back),
    rank 1 late before every fourth; replayed with fresh inputs written in place."""
    dev = group.device
    xs = [torch.zeros(SIZES[i % len(SIZES)] // 2, dtype=torch.bfloat16, device=dev) for i in range(PER_GRAPH)]

    def run() -> None:
        for i, x in enumerate(xs):
            if group.rank == 1 and i % 4 == 0:
                torch.cuda._sleep(20_000)  # NOTE: skewed arrival: the barrier really waits
            torch.ops.graphrt.all_reduce_(x, group.name)

    stream = torch.cuda.Stream(dev)
    with torch.cuda.stream(stream):
        run()  # NOTE: compiles every size outside the capture
    torch.cuda.synchronize(dev)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        run()
    found = {}
    for replay in range(3):
        inputs = fresh(xs)
        graph.replay()
        torch.cuda.synchronize(dev)
        found[f"replay {replay}"] = _exact(group, xs, inputs)
    graph.reset()
    return found


@pytest.fixture(scope="module")
def sums() -> list[dict[str, tuple[bool, bool]]]:
    return run_ranks(_sums, 2, backend="nccl", timeout_s=60, deadline_s=300)


def test_eager_p2p_sums_are_exact_and_identical(sums: list) -> None:
    for rank, found in enumerate(sums):
        for case, (exact, identical) in found.items():
            if case.startswith(("eager", "nccl")):
                assert exact, f"rank {rank} {case}: differs from the rank-order fp32 sum"
                assert identical, f"rank {rank} {case}: ranks got different sums"


def test_graphed_p2p_sums_are_exact_replay_after_replay(sums: list) -> None:
    for rank, found in enumerate(sums):
        replays = {case: v for case, v in found.items() if case.startswith("replay")}
        assert len(replays) == 3
        for case, (exact, identical) in replays.items():
            assert exact, f"rank {rank} {case}: a graphed sum differs from the reference (stale barrier?)"
            assert identical, f"rank {rank} {case}: ranks got different sums"


def _decode_logits(rank: int, world: int, mode: str) -> tuple[np.ndarray, np.ndarray, str, int]:
    from graphrt.parallel import init_tp
    from graphrt.parallel.ops import communicator
    from graphrt.step.modes import SpecGeometry
    from tests.runtime.test_spec_modes import filled, setup_for
    from tests.support.util import decode_batch

    os.environ["GRAPHRT_ALLREDUCE"] = mode
    group = init_tp(world, torch.device("cuda"))
    tp = setup_for(group.device, SpecGeometry(num_steps=3), tp=group)
    lens = filled(tp, np.random.default_rng(7))
    reqs = [0, 2, 5]
    batch = decode_batch(tp, reqs, [lens[r] + 1 for r in reqs], np.random.default_rng(1))
    graph, eager = tp.runtime.run(batch), tp.runtime.run(batch, eager=True)
    small = communicator(group.name).small
    launches = 0 if small is None else int(small.epochs[0])  # NOTE: program 0 runs in every sum
    return graph.float().cpu().numpy(), eager.float().cpu().numpy(), type(small).__name__, launches


def test_decode_logits_with_p2p_equal_nccl() -> None:
    kw = dict(backend="nccl", timeout_s=120, deadline_s=600)
    p2p = run_ranks(_decode_logits, 2, "p2p", **kw)
    nccl = run_ranks(_decode_logits, 2, "nccl", **kw)
    for rank in range(2):
        assert p2p[rank][2] == "PeerSum" and nccl[rank][2] == "NoneType"
        assert p2p[rank][3] > 10, f"rank {rank}: only {p2p[rank][3]} p2p sums ran (warm-up, prefill, steps)"
        for i, path in enumerate(("graph", "eager")):
            diff = float(np.abs(p2p[rank][i] - nccl[rank][i]).max())
            assert diff <= 1e-2, f"rank {rank} {path}: |p2p - nccl| = {diff}"
            assert np.array_equal(p2p[rank][i], nccl[rank][i]), (
                f"rank {rank} {path}: close ({diff}), not equal"
            )

"""The p2p all-reduce's host logic on the CPU: modes, limits, which sums take it, the oracle's math.

The kernel itself runs in ``tests/parallel/test_p2p_kernel.py`` (Triton's interpreter, sm_90
PTX) and ``tests/parallel/test_p2p_gpu.py`` (2 GPUs).
"""

from __future__ import annotations

import pytest
import torch

from graphrt.parallel import TPGroup
from graphrt.parallel.ops import DEFAULT_MAX_BYTES, DEFAULT_MODE, MODES, Communicator, max_bytes, small_sums
from graphrt.parallel.p2p import ALIGN, check_capacity, fits, reference_sum
from graphrt.parallel.p2p_kernel import BLOCK, blocks

CPU = torch.device("cpu")


def test_modes_table_names_p2p_with_its_own_limit() -> None:
    p2p = small_sums("p2p")
    assert p2p is not None and p2p.required and p2p.limit_env == "GRAPHRT_P2P_MAX_BYTES"
    assert small_sums("nccl") is None
    assert not small_sums("auto").required and small_sums("oneshot").required  # type: ignore[union-attr]
    assert small_sums("auto").build is p2p.build and DEFAULT_MODE == "auto"  # type: ignore[union-attr]
    assert list(MODES) == ["nccl", "auto", "oneshot", "p2p"]


class _Path:
    closed = False

    def close(self) -> None:
        self.closed = True


def _agreed(rank: int, world: int) -> tuple[bool, bool, list[str]]:
    """Rank 1 cannot set p2p up; rank 0 can. ``auto``: both end with NCCL (rank 0 closes its path)."""
    import warnings

    from graphrt.parallel import ops, p2p

    group = TPGroup(rank=rank, size=world, device=CPU, cpu_group=torch.distributed.group.WORLD)
    path = _Path()

    def create(_group: TPGroup, _max: int) -> _Path:
        if rank == 1:
            raise RuntimeError("no peer access here")
        return path

    p2p.PeerSum.create = create  # type: ignore[method-assign]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = ops.small_sums("auto").build(group, 4096, False)  # type: ignore[union-attr]
    return got is None, path.closed, [str(w.message) for w in seen]


def test_auto_takes_p2p_only_when_every_rank_can() -> None:
    from tests.support.tp_util import run_ranks

    (none0, closed0, said0), (none1, _, said1) = run_ranks(_agreed, 2)
    assert none0 and none1 and closed0
    assert said0 == ["rank 0: p2p all-reduce off, NCCL only: off on a peer"]
    assert said1 == ["rank 1: p2p all-reduce off, NCCL only: no peer access here"]


def test_p2p_by_name_is_an_error_when_it_cannot_be_set_up(monkeypatch: pytest.MonkeyPatch) -> None:
    from graphrt.parallel import p2p

    def create(group: TPGroup, max_bytes: int) -> None:
        raise RuntimeError("no symmetric memory")

    monkeypatch.setattr(p2p.PeerSum, "create", create)
    with pytest.raises(RuntimeError, match="rank 0: GRAPHRT_ALLREDUCE=p2p unavailable: no symmetric memory"):
        small_sums("p2p").build(TPGroup(device=CPU), 4096, True)  # type: ignore[union-attr]


def test_cpu_groups_ignore_the_p2p_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAPHRT_ALLREDUCE", "p2p")
    assert Communicator(TPGroup(rank=0, size=2, device=CPU)).small is None


@pytest.mark.parametrize("value", ["64k", "0", "-16", ""])
def test_bad_byte_limit_is_refused_naming_the_variable_and_value(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GRAPHRT_P2P_MAX_BYTES", value)
    with pytest.raises(
        ValueError, match=f"GRAPHRT_P2P_MAX_BYTES={value!r}: expected a positive number of bytes"
    ):
        max_bytes("GRAPHRT_P2P_MAX_BYTES")


def test_byte_limit_default_and_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GRAPHRT_P2P_MAX_BYTES", raising=False)
    assert max_bytes("GRAPHRT_P2P_MAX_BYTES") == DEFAULT_MAX_BYTES == 256 * 1024
    monkeypatch.setenv("GRAPHRT_P2P_MAX_BYTES", "65536")
    assert max_bytes("GRAPHRT_P2P_MAX_BYTES") == 65536


def test_capacity_counts_programs_of_two_byte_elements() -> None:
    assert check_capacity(256 * 1024, 2, 9216) == blocks(128 * 1024) == 128 * 1024 // BLOCK
    assert check_capacity(ALIGN, 8, 9216) == 1


def test_capacity_refuses_a_limit_past_the_signal_pad_naming_both() -> None:
    rows = blocks(1 << 19)
    with pytest.raises(
        ValueError, match=rf"max_bytes=1048576 needs {rows} programs x 8 ranks .* holds 9216 bytes"
    ):
        check_capacity(1 << 20, 8, 9216)
    with pytest.raises(ValueError, match=f"max_bytes=1000: expected a positive multiple of {ALIGN}"):
        check_capacity(1000, 2, 9216)


def test_the_limit_suggested_by_the_error_fits() -> None:
    with pytest.raises(ValueError, match=r"at most (\d+)\)") as err:
        check_capacity(1 << 20, 8, 9216)
    suggested = int(err.value.args[0].rsplit("at most ", 1)[1].rstrip(")"))
    assert check_capacity(suggested, 8, 9216) * 8 * 4 <= 9216


def test_fits_takes_small_contiguous_float_sums_on_its_device() -> None:
    limit = 8192
    x = torch.zeros(4096, dtype=torch.bfloat16)
    assert fits(x, limit, CPU)
    assert fits(torch.zeros(2048, dtype=torch.float32), limit, CPU)
    assert not fits(torch.zeros(4097, dtype=torch.bfloat16), limit, CPU), "one element past the limit"
    assert not fits(torch.zeros(64, dtype=torch.int64), limit, CPU), "integers go through NCCL"
    assert not fits(torch.zeros(64, 2, dtype=torch.float16).t(), limit, CPU), "strided goes through NCCL"
    assert not fits(x, limit, torch.device("meta")), "another device"


def test_reference_sums_in_rank_order_in_fp32() -> None:
    big = torch.tensor([2.0**24], dtype=torch.float32)
    one = torch.ones(1, dtype=torch.float32)
    # NOTE: 2^24 + 1 rounds back to 2^24 in fp32, 1 + 1 does not: the order shows.
    assert reference_sum([big, one, one]).item() == 2.0**24
    assert reference_sum([one, one, big]).item() == 2.0**24 + 2


def test_reference_rounds_the_fp32_sum_once_to_bf16() -> None:
    gen = torch.Generator().manual_seed(0)
    parts = [torch.randn(1000, generator=gen).bfloat16() for _ in range(4)]
    out = reference_sum(parts)
    want = ((parts[0].float() + parts[1].float()) + parts[2].float()) + parts[3].float()
    assert out.dtype == torch.bfloat16 and torch.equal(out, want.bfloat16())
    assert not torch.equal(out, ((parts[0] + parts[1]) + parts[2]) + parts[3]), "bf16 steps round more"


def test_reference_keeps_negative_zero() -> None:
    zero = torch.tensor([-0.0], dtype=torch.bfloat16)
    assert torch.signbit(reference_sum([zero, zero])).item()


class _Trapped:
    """A p2p path whose kernel gave up on peer 0 (what ``PeerSum.stalled_peer`` reads)."""

    def stalled_peer(self) -> int | None:
        return 0

    def close(self) -> None:
        pass


class _LostContext:
    """A runtime whose device context is gone: every step raises CUDA's error."""

    def __init__(self) -> None:
        from types import SimpleNamespace

        self.capturer = SimpleNamespace(agree=None)  # NOTE: TPRuntime sets its ranks' agreement

    def run(self, batch: object, eager: bool, feed: object) -> None:
        raise RuntimeError("CUDA error: unspecified launch failure")


def test_a_trapped_sum_turns_the_next_cuda_error_into_a_collective_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from types import SimpleNamespace

    from graphrt.parallel import CollectiveError, Message, Op, ops
    from graphrt.runtime.tp import TPRuntime

    group = TPGroup(rank=1, size=2, device=CPU, timeout_s=5.0, name="trap")
    comm = Communicator(group)
    monkeypatch.setitem(ops._COMMS, "trap", comm)
    rt = TPRuntime(_LostContext(), SimpleNamespace(group=group))  # type: ignore[arg-type]
    step = Message(Op.RUN, batch=object())  # type: ignore[arg-type]
    assert ops.stalled_sum() is None
    with pytest.raises(RuntimeError, match="unspecified launch failure") as plain:
        rt.step(step)
    assert type(plain.value) is RuntimeError  # NOTE: no stalled sum: the error as it came
    comm.small = _Trapped()
    with pytest.raises(
        CollectiveError,
        match=r"rank 1 of 2: a p2p all-reduce waited more than 5 s \(GRAPHRT_TP_TIMEOUT\) for rank 0 and trapped",
    ) as err:
        rt.step(step)
    assert "unspecified launch failure" in str(err.value.__cause__)

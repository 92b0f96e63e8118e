"""The p2p all-reduce kernel without a GPU: its protocol run by Triton's interpreter across real
processes, and its sm_90 build (system-scope release/acquire flags, 16-byte vectors, no spills).

Interpreter: each rank is a process whose "symmetric" buffer and signal pad are CPU tensors in
shared memory (mapped at another address in every process, as peer memory is), so the barrier,
the epochs and the two slots run as on GPUs, without GPU memory ordering. fp16 and fp32 only: the
interpreter truncates fp32 to bf16 where GPUs round to nearest even. Skipped without Triton.
"""

from __future__ import annotations

import os

import pytest
import torch

from graphrt.kernels.switches import triton
from graphrt.parallel.p2p import reference_sum
from graphrt.parallel.p2p_kernel import BLOCK, blocks
from tests.support.tp_util import run_ranks
from tests.support.triton_util import INTERPRET

pytestmark = pytest.mark.skipif(triton is None, reason="needs Triton")
SLOT_BYTES = 4 * 4096
#: Sums in launch order: sizes around ``BLOCK`` (programs drop out and come back), two dtypes.
SUMS = (
    (2500, torch.float16),
    (BLOCK, torch.float16),
    (7, torch.float32),
    (3000, torch.float32),
    (1100, torch.float16),
)


def _ranks_sum(rank: int, world: int, buffers: list, pads: list, inputs: list) -> list[list[int]]:
    """This rank's launches on its slice of ``inputs``; the sums' bits (int lists)."""
    assert os.environ.get("TRITON_INTERPRET") == "1", "set before the spawn, so before triton's import"
    from graphrt.parallel.p2p_kernel import launch

    table = [torch.tensor([t.data_ptr() for t in ts], dtype=torch.int64) for ts in (buffers, pads)]
    epochs = torch.zeros(blocks(SLOT_BYTES // 2), dtype=torch.int32)
    out = []
    for parts in inputs:
        x = parts[rank].clone()
        launch(x, SLOT_BYTES // x.element_size(), table[0], table[1], epochs, rank, world)
        out.append(x.view(torch.int16 if x.element_size() == 2 else torch.int32).tolist())
    return out


@pytest.mark.parametrize(("world", "sums"), [(2, SUMS), (3, SUMS[:3])])
def test_interpreted_ranks_sum_in_rank_order_launch_after_launch(
    world: int, sums: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    buffers = [torch.zeros(2 * SLOT_BYTES, dtype=torch.uint8).share_memory_() for _ in range(world)]
    pads = [
        torch.zeros(blocks(SLOT_BYTES // 2) * world, dtype=torch.int32).share_memory_() for _ in range(world)
    ]
    gen = torch.Generator().manual_seed(world)
    inputs = [[torch.randn(n, generator=gen).to(dtype) for _ in range(world)] for n, dtype in sums]
    results = run_ranks(_ranks_sum, world, buffers, pads, inputs, deadline_s=120)
    for i, parts in enumerate(inputs):
        want = reference_sum(parts)
        bits = want.view(torch.int16 if want.element_size() == 2 else torch.int32).tolist()
        for rank in range(world):
            assert results[rank][i] == bits, f"sum {i} ({want.numel()} x {want.dtype}) on rank {rank}"
    # NOTE: every flag holds the launches of its program: the barrier left nothing behind.
    launches = [sum(n > p * BLOCK for n, _ in sums) for p in range(blocks(max(n for n, _ in sums)))]
    flags = pads[0].view(-1, world)[: len(launches)]
    assert flags[:, 1:].tolist() == [[k] * (world - 1) for k in launches]


def _ptx(world: int, dtype: str) -> str:
    from graphrt.parallel.p2p_kernel import p2p_all_reduce
    from tests.support.triton_util import sm90_ptx

    names = p2p_all_reduce.arg_names
    constexprs = dict(RANK=world - 1, WORLD=world, BLOCK=BLOCK, PDL=True, DEADLINE=True)
    types = {
        "x": f"*{dtype}",
        "n": "i32",
        "slot_elems": "i32",
        "buffers": "*i64",
        "pads": "*i64",
        "epochs": "*i32",
        "timeout_ns": "i64",
    }
    signature = {a: types.get(a, "constexpr") for a in names}
    attrs = {
        (names.index(a),): [["tt.divisibility", 16]] for a in types if a != "timeout_ns"
    }  # NOTE: as a 16-aligned launch
    return sm90_ptx(p2p_all_reduce, signature, constexprs, {"num_warps": 4}, attrs)


@pytest.mark.skipif(INTERPRET, reason="needs Triton's compiler (TRITON_INTERPRET=1 wraps every kernel)")
@pytest.mark.parametrize(("world", "dtype"), [(2, "bf16"), (8, "bf16"), (3, "fp32")])
def test_sm90_build_has_system_scope_flags_and_vector_loads(world: int, dtype: str) -> None:
    from tests.support.triton_util import NO_SPILLS, ptxas_report

    ptx = _ptx(world, dtype)
    peers = world - 1
    # NOTE: one release per peer flag, system scope; one more per peer: the stall word before a trap
    assert ptx.count("atom.global.sys.release.exch.b32") == 2 * peers
    # NOTE: Triton lowers the acquire add of 0 to an acquire load (3.6 and 3.9 alike)
    acquires = ptx.count("ld.global.sys.acquire.b32") + ptx.count("atom.global.sys.acquire.add")
    assert acquires == 2 * peers, "acquire reads of the own flags, per peer: first, then the spin"
    assert "atom.global.gpu" not in ptx and "atom.global.cta" not in ptx, "every flag at system scope"
    assert ptx.index("griddepcontrol.wait") < ptx.index("atom.global.sys.release"), (
        "x read after the PDL wait"
    )
    vectors = BLOCK * (4 if dtype == "fp32" else 2) // (4 * 32 * 16)  # NOTE: 16-byte vectors a thread
    assert ptx.count("ld.global.v4.b32") == world * vectors, "x, then 16-byte vector loads of each peer slot"
    assert ptx.count("st.global.v4.b32") == 2 * vectors, "the own slot, then the sum"
    assert NO_SPILLS in ptxas_report(ptx)
    # NOTE: a peer that never arrives traps the kernel after the group's timeout: no hang
    assert ptx.count("%globaltimer") == 2 * peers and ptx.count("trap;") == peers
    before_trap = ptx[: ptx.index("trap;")]
    assert before_trap.count("atom.global.sys.release.exch.b32") == peers + 1, "the stall word, then trap"
    # NOTE: the stall word's atomic runs on one thread: every thread waits for its return (the
    # barrier of its broadcast) and for the write to reach host memory before one of them traps
    stall_write = before_trap[before_trap.rindex("atom.global.sys.release.exch.b32") :]
    assert "bar.sync" in stall_write and ptx.count("membar.sys; trap;") == peers


_ABSENT_PEER = """
import sys, time, torch
from graphrt.parallel.p2p_kernel import blocks, launch
dev = torch.device("cuda")
x = torch.ones(3000, dtype=torch.bfloat16, device=dev)
slot = 4096
buf = torch.zeros(2 * 2 * slot, dtype=torch.uint8, device=dev)
pad = torch.zeros(blocks(slot) * 2, dtype=torch.int32, device=dev)
table = torch.tensor([buf.data_ptr()] * 2, dtype=torch.int64, device=dev)
stall = torch.zeros(1, dtype=torch.int32).pin_memory()
pads = torch.tensor([pad.data_ptr()] * 2 + [stall.data_ptr()], dtype=torch.int64, device=dev)
epochs = torch.zeros(blocks(slot), dtype=torch.int32, device=dev)
start = time.perf_counter()
launch(x, slot, table, pads, epochs, rank=0, world=2, timeout_s=0.2)  # rank 1 never launches
try:
    torch.cuda.synchronize()
except RuntimeError as err:
    print(f"raised after {time.perf_counter() - start:.2f} s, stalled on {int(stall[0]) - 1}: {err}")
    sys.exit(0)
sys.exit("the sum returned although its peer never arrived")
"""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
def test_a_peer_that_never_arrives_is_an_error_after_the_timeout_not_a_hang() -> None:
    """One rank of two launches; the other never does. The kernel traps after ``timeout_s`` and the
    host's sync raises (in a child process: a trap ends its CUDA context); the stall word in
    pinned host memory names the peer."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _ABSENT_PEER], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "stalled on 1:" in done.stdout, done.stdout  # NOTE: the peer, written before the trap

"""The split decode kernel's merge (``graphrt.attention.split_decode.launch``): the last split
program holding keys merges its heads in the split launch, ``CHUNK`` splits a step.

Runs on the GPU (``-m gpu``) and on the CPU under ``TRITON_INTERPRET=1`` (small shapes; a CPU box
with Triton reruns this file so, last test). Lengths leave most splits without keys (a 4096-key
table, 1024 under the interpreter; rows of 1, 65, 512 and 0 keys) and split counts run past the table's key blocks. Checked:
the merge within the kernel's tolerance of the float64 oracle and a second launch bit-equal; a
merge of 2 splits a step within one bf16 rounding of the default tile's; the arrival counters at
0 after every launch; a row without keys gets zeros; on the GPU a graph (PDL) replayed with new
lengths bit-equal to eager calls.
"""

from __future__ import annotations

import pytest
import torch

from graphrt.attention.split_decode import attend as dk
from graphrt.attention.split_decode import launch as dl
from graphrt.kernels import scratch, tuning
from tests.attention.test_decode_kernel import oracle
from tests.support.triton_util import (
    INTERPRET,
    NO_SPILLS,
    ptxas_report,
    rerun_marks,
    rerun_under_interpreter,
    sm90_ptx,
    triton_devices,
)
from tests.support.tuning_util import patch_tuning

ATOL = 2e-2
#: Splits merged a step, by mode: the default tile, and 2 splits of each head a step (chunks).
CHUNKS = ("default", "chunks")
#: (query heads, KV heads, head dim): SmolLM2 (the interpreter's), Llama-3.2-1B, Llama-3-8B, MHA.
GPU_SHAPES = [(9, 3, 64), (32, 8, 64), (32, 8, 128), (4, 4, 64)]
#: (table width in keys, lengths): most splits empty; a table narrower than the split counts.
TABLES = [(4096, [1, 65, 512, 0]), (128, [1, 65, 128, 0])]


def case(device: torch.device, lens: list[int], shape: tuple[int, int, int], keys: int, page: int = 16):
    """Random bf16 q and caches; a ``keys``-wide table per request: its own pages shuffled, then
    page 0 (the pad page, as the runtime pads a table) to the width."""
    heads, heads_k, d = shape
    gen = torch.Generator().manual_seed(11)
    need = [-(-n // page) for n in lens]
    perm = (torch.randperm(sum(need), generator=gen) + 1).to(torch.int32).split(need)
    table = torch.zeros(len(lens), keys // page, dtype=torch.int32)
    for row, pages in zip(table, perm, strict=True):
        row[: len(pages)] = pages
    cache = (sum(need) + 1, page, heads_k, d)
    k, v = torch.randn(cache, generator=gen), torch.randn(cache, generator=gen)
    q = torch.randn(len(lens), heads, d, generator=gen)
    q, k, v = (t.to(device, torch.bfloat16) for t in (q, k, v))
    return q, k, v, table.to(device), torch.tensor(lens, dtype=torch.int32, device=device)


def split_counts(device: torch.device, keys: int) -> tuple[int, ...]:
    """Split counts the interpreter can afford (one past the splits holding keys); on the GPU up
    to far past the key blocks."""
    if device.type == "cpu":
        return (1, 17) if keys > 128 else (3,)
    return (1, 7, 33, 80)


@pytest.mark.parametrize("device", triton_devices())
@pytest.mark.parametrize("mode", CHUNKS)
@pytest.mark.parametrize(("keys", "lens"), TABLES)
@pytest.mark.parametrize("shape", GPU_SHAPES)
def test_merge_matches_the_oracle_in_any_chunking(device, mode, keys, lens, shape, monkeypatch) -> None:
    """On the GPU a row of ``keys - 1`` keys too: many splits hold keys (several merge steps)."""
    if device.type == "cpu" and shape != GPU_SHAPES[0]:
        pytest.skip("the interpreter runs the small shape")
    cuda = device.type == "cuda"
    keys = keys if cuda else min(keys, 1024)  # NOTE: the interpreter: 17 splits, 8 holding keys
    lens = lens + [keys - 1] * cuda
    q, k, v, table, seqlens = case(device, lens, shape, keys)
    scale = shape[2] ** -0.5
    expected = oracle(q, k, v, table, seqlens, scale)
    for splits in split_counts(device, keys):
        want = dk.decode_attention(q, k, v, table, seqlens, scale, splits, False)
        got = want
        if mode == "chunks":
            patch_tuning(monkeypatch, decode_merge_tile=2 * 4 * shape[2])  # NOTE: 2 splits of 3 or 4 heads
            got = dk.decode_attention(q, k, v, table, seqlens, scale, splits, False)
            monkeypatch.undo()
            torch.testing.assert_close(got.float(), want.float(), atol=1e-5, rtol=2**-7)
        assert not scratch.counters(len(lens) * shape[1], device).any(), "counters left at 0"
        if cuda:
            again = dk.decode_attention(q, k, v, table, seqlens, scale, splits, False)
            assert torch.equal(want, again), f"{splits} splits: a second launch differs"
        assert got[3].abs().max() == 0, "the row without keys gets zeros"
        torch.testing.assert_close(
            got.double().cpu(), expected, atol=ATOL, rtol=ATOL, msg=lambda m, s=splits: f"{s}: {m}"
        )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or dk.triton is None, reason="no CUDA / Triton")
def test_a_graph_replay_with_new_lengths_equals_eager() -> None:
    """Captured once with PDL on a side stream (warmed up there first, so the last-split merge
    shares that stream's counters), then lengths and pages rewritten in place: every replay
    equals an eager call (no PDL) bit for bit, and the counters read 0 after each."""
    q, k, v, table, seqlens = case(torch.device("cuda"), [1, 65, 512, 0], (32, 8, 64), 4096)
    splits = dk.num_splits(4, 8, 4096, torch.cuda.get_device_properties(0).multi_processor_count)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        dk.decode_attention(
            q, k, v, table, seqlens, 0.125, splits, True
        )  # NOTE: compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = dk.decode_attention(q, k, v, table, seqlens, 0.125, splits, True)
    torch.cuda.synchronize()
    for lens in ([600, 0, 1, 4096], [64, 65, 0, 3000], [0, 0, 0, 1], [1, 65, 512, 0]):
        seqlens.copy_(torch.tensor(lens, dtype=torch.int32))
        table.copy_(table.roll(1, 0))  # NOTE: other rows' pages (no row reads past the cache)
        graph.replay()
        eager = dk.decode_attention(q, k, v, table, seqlens, 0.125, splits, False)
        torch.cuda.synchronize()
        assert torch.equal(out, eager), lens
        with torch.cuda.stream(stream):
            assert not scratch.counters(4 * 8, q.device).any(), f"{lens}: counters left at 0"


def test_counters_are_shared_per_stream_and_sized_in_powers_of_two() -> None:
    cpu = torch.device("cpu")
    a, b = scratch.counters(5, cpu), scratch.counters(8, cpu)
    assert a is b and a.shape == (8,) and a.dtype == torch.int32 and not a.any()
    assert scratch.counters(9, cpu).shape == (16,)


@pytest.mark.skipif(dk.triton is None or INTERPRET, reason="needs Triton's compiler")
@pytest.mark.parametrize("rope", [False, True])
@pytest.mark.parametrize(("d", "group", "options"), [(64, 4, False), (128, 4, False), (64, 8, True)])
def test_split_kernel_compiles_for_hopper_without_spills(
    d: int, group: int, options: bool, rope: bool
) -> None:
    """The split launch through Triton's CUDA compiler for sm_90 (no GPU needed), the 1B / 8B
    geometry (G 4, 33 splits) and gpt-oss's (G 8, a sliding window and sinks) with PDL, with
    and without RoPE and the KV store fused in: ptxas spills nothing at head dims 64 and 128
    (256 already spills), and the last-split merge counts arrivals with one acq_rel atomic;
    fused, the key loop reads the cache through L1-coherent loads (no ``.nc``: its own program
    stored the newest key there)."""
    ptrs = (
        "q k_cache v_cache page_table seqlens m_out l_out acc_out arrivals out sinks k_new v_new cos_sin loc"
    )
    types = "bf16 bf16 bf16 i32 i32 fp32 fp32 fp32 i32 bf16 bf16 bf16 bf16 bf16 i64"
    ints = "q_sb q_sh kc_sp kc_ss kc_sh pt_sb o_sb o_sh kn_sb vn_sb cs_sb loc_sb window"
    constexprs = dict(
        PAGE=16, D=d, G=group, BLOCK_G=16, BLOCK_N=64, SPLITS=33, PDL=True, F32_DOT=False, MERGE_G=group,
        CHUNK=tuning.DEFAULT.decode_merge_tile // (group * d), WINDOW=options, SINKS=options, ROPE=rope,
    )  # fmt: skip
    ptx = _ptx(dl.kernels._decode_split, ptrs, types, ints, constexprs, tuning.DEFAULT.split_warps(d))
    assert ptx.count("atom.global.gpu.acq_rel.add") == 1
    assert "ld.global.nc" not in ptx
    assert NO_SPILLS in ptxas_report(ptx)


def _ptx(fn, ptrs: str, types: str, ints: str, constexprs: dict, warps: int) -> str:
    """``fn`` compiled for sm_90: pointers ``ptrs`` to ``types``, i32 ``ints``, fp32 the rest."""
    signature = {name: "*" + t for name, t in zip(ptrs.split(), types.split(), strict=True)}
    signature.update(dict.fromkeys(ints.split(), "i32"))
    params = [a for a in fn.arg_names if a not in signature and a not in constexprs]
    signature.update(dict.fromkeys(params, "fp32"))
    signature.update(dict.fromkeys(constexprs, "constexpr"))
    return sm90_ptx(fn, signature, constexprs, {"num_warps": warps})


@rerun_marks
def test_kernel_under_triton_interpreter() -> None:
    """On a CPU box: this file again, with the kernels run by Triton's interpreter."""
    rerun_under_interpreter(__file__, passed=5)

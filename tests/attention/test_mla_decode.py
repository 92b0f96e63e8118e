"""The dense-MLA split decode kernel (``graphrt.attention.split_decode.mla_attend``): the absorbed
form of DeepSeek-V2/V3 decode (``q_rope`` against the RoPE keys plus ``qv`` against the latents,
the latents as values) in one launch, against a float64 loop and the reference backend's ``qv``
math (float32), within bf16 tolerances.

Runs on the GPU (``-m gpu``) and on the CPU under ``TRITON_INTERPRET=1`` (a CPU box with Triton
reruns this file so, last test). Rows of 1, 0 (a pad row), 40, 130 and 300 keys on shuffled pages
padded with page 0 to the table's width; split counts past the keys' 128-key granules (splits
without keys); page sizes 1, 16 and 64; V2-Lite's 16 heads, V3's 128 (8 head blocks) and a
4-head toy. Also: the arrival counters back at 0, which steps the kernel takes, that FA3-MLA
yields it the small decode steps in the ``mla`` table's dispatch, and a compile for sm_90
without register spills.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from graphrt.attention import AttendCall, registry
from graphrt.attention.dispatch import Dispatch
from graphrt.attention.reference import paged_attention
from graphrt.attention.split_decode import mla_attend as mk
from graphrt.attention.split_decode import mla_launch as ml
from graphrt.attention.split_decode.mla_backend import MLASplitDecodeBackend
from graphrt.kernels import scratch
from graphrt.kernels.switches import triton
from tests.support.triton_util import (
    INTERPRET,
    NO_SPILLS,
    ptxas_report,
    rerun_marks,
    rerun_under_interpreter,
    sm90_ptx,
    triton_devices,
)

#: bf16 inputs, fp32 sums, p rounded to bf16 before ``p @ latent``, one bf16 rounding of the output.
ATOL = 1e-2  # NOTE: the interpreter's worst case is half of it; a 1 % error in the scale fails it
ROPE, LATENT = mk.ROPE_DIM, mk.LATENT_DIM
SCALE = 192**-0.5  # NOTE: DeepSeek's (nope 128 + rope 64) ** -0.5
LENS = [1, 0, 40, 130, 300]


def case(device: torch.device, lens: list[int], heads: int, page: int, keys: int = 384):
    """bf16 ``q_rope``, ``qv`` and caches; each request's pages shuffled, then page 0 (the pad
    page) to the ``keys``-wide table, as the runtime pads a table."""
    gen = torch.Generator().manual_seed(heads + page)
    need = [-(-n // page) for n in lens]
    perm = (torch.randperm(sum(need), generator=gen) + 1).to(torch.int32).split(need)
    table = torch.zeros(len(lens), keys // page, dtype=torch.int32)
    for row, pages in zip(table, perm, strict=True):
        row[: len(pages)] = pages
    rope = torch.randn(sum(need) + 1, page, 1, ROPE, generator=gen)
    latent = torch.randn(sum(need) + 1, page, 1, LATENT, generator=gen)
    q_rope, qv = (
        torch.randn(len(lens), heads, ROPE, generator=gen),
        torch.randn(len(lens), heads, LATENT, generator=gen),
    )
    q_rope, qv, rope, latent = (t.to(device, torch.bfloat16) for t in (q_rope, qv, rope, latent))
    return q_rope, qv, rope, latent, table.to(device), torch.tensor(lens, dtype=torch.int32, device=device)


def oracle(q_rope, qv, rope, latent, table, seqlens, scale: float) -> torch.Tensor:
    """float64 loop: each request's keys through its table, ``softmax(scores) @ latent``; a row
    without keys gets zeros. ``[B, H, 512]``."""
    page = rope.shape[1]
    rope, latent = rope.double().cpu().view(-1, ROPE), latent.double().cpu().view(-1, LATENT)
    out = torch.zeros(*qv.shape, dtype=torch.float64)
    for b, n in enumerate(seqlens.tolist()):
        if n == 0:
            continue
        pos = torch.arange(n)
        slots = table[b].cpu().long()[pos // page] * page + pos % page
        scores = (q_rope[b].double().cpu() @ rope[slots].T + qv[b].double().cpu() @ latent[slots].T) * scale
        out[b] = scores.softmax(-1) @ latent[slots]
    return out


def reference(q_rope, qv, rope, latent, table, seqlens, scale: float) -> torch.Tensor:
    """The reference backend's ``qv`` math (float32) for one query token a request."""
    return paged_attention(q_rope[:, None], rope, latent, table, seqlens, scale, qv=qv[:, None])[:, 0]


@pytest.mark.parametrize("device", triton_devices())
@pytest.mark.parametrize(("heads", "page"), [(16, 64), (16, 1), (128, 16), (4, 16)])
def test_kernel_matches_the_oracles_at_any_split_count(device, heads: int, page: int) -> None:
    """Split counts 1, 3 (300 keys: every split holds keys) and 5 (past the granules)."""
    case_ = case(device, LENS, heads, page)
    want64 = oracle(*case_, SCALE)
    want32 = reference(*case_, SCALE).double().cpu()
    torch.testing.assert_close(want32, want64, atol=1e-4, rtol=1e-4)  # NOTE: the two oracles agree
    for splits in (1, 3, 5):
        got = mk.mla_decode_attention(*case_, SCALE, splits, False)
        assert got.shape == (len(LENS), heads, LATENT) and got.dtype == torch.bfloat16
        assert not scratch.counters(len(LENS) * max(1, heads // 16), device).any(), "counters left at 0"
        assert got[1].abs().max() == 0, "the row without keys gets zeros"
        msg = lambda m, s=splits: f"{s} splits: {m}"  # noqa: E731
        torch.testing.assert_close(got.double().cpu(), want64, atol=ATOL, rtol=ATOL, msg=msg)


@pytest.mark.parametrize("device", triton_devices())
def test_the_backend_runs_the_kernel_on_decode_steps_and_the_reference_else(device, monkeypatch) -> None:
    """``forward`` of a decode step: the kernel (bit-equal to the op with the step's split count);
    a step of two tokens a request: the reference."""
    if device.type == "cpu":
        monkeypatch.setenv("GRAPHRT_DECODE_ATTENTION", "interpret")
    q_rope, qv, rope, latent, table, seqlens = case(device, LENS, 16, 16)
    bufs = SimpleNamespace(page_table=table, cache_seqlens=seqlens)
    meta = SimpleNamespace(buffers=bufs, page_size=16, cascade=None, max_seqlen_q=1)
    call = AttendCall(q_rope, rope, latent, meta, SCALE, qv=qv)  # type: ignore[arg-type]
    backend = MLASplitDecodeBackend(torch.bfloat16)
    assert backend.takes(call)
    splits = mk.num_splits(len(LENS), 1, table.shape[1] * 16, mk.sms(device))
    pdl = mk.pdl_enabled(mk.PDL_ENV, device)
    got = backend.forward(call)
    assert torch.equal(
        got, mk.mla_decode_attention(q_rope, qv, rope, latent, table, seqlens, SCALE, splits, pdl)
    )
    want = reference(q_rope, qv, rope, latent, table, seqlens, SCALE)
    torch.testing.assert_close(got.double().cpu(), want.double().cpu(), atol=ATOL, rtol=ATOL)
    verify = SimpleNamespace(buffers=bufs, page_size=16, cascade=None, max_seqlen_q=2)
    assert not backend.takes(AttendCall(q_rope, rope, latent, verify, SCALE, qv=qv))  # type: ignore[arg-type]


def test_only_single_token_16_bit_steps_of_deepseek_widths_take_the_kernel(monkeypatch) -> None:
    """The rule a backend applies (``takes``), with the switch forced on: one token a request,
    ``qv``, no window, sinks, FP8 scales nor tree, 16-bit tensors, RoPE 64 + latent 512, heads in
    whole blocks of 16."""
    monkeypatch.setattr(mk, "enabled", lambda device: True)
    cpu = torch.device("cpu")
    q_rope, qv, rope, latent, table, seqlens = case(cpu, [5, 40], 16, 16, 64)
    meta = SimpleNamespace(
        buffers=SimpleNamespace(page_table=table, cache_seqlens=seqlens), cascade=None, max_seqlen_q=1
    )
    assert mk.takes(q_rope, rope, latent, meta, qv=qv)  # type: ignore[arg-type]
    assert not mk.takes(q_rope, rope, latent, meta)  # type: ignore[arg-type]
    for option in ({"window": 8}, {"sinks": q_rope[0, :, 0]}, {"kv_scales": object()}):
        assert not mk.takes(q_rope, rope, latent, meta, qv=qv, **option), option  # type: ignore[arg-type]
    tree = SimpleNamespace(**{**vars(meta), "cascade": object()})
    assert not mk.takes(q_rope, rope, latent, tree, qv=qv)  # type: ignore[arg-type]
    assert not mk.takes(q_rope.float(), rope.float(), latent.float(), meta, qv=qv.float())  # type: ignore[arg-type]
    assert not mk.takes(q_rope[..., :32], rope[..., :32].contiguous(), latent, meta, qv=qv)  # type: ignore[arg-type]
    assert mk.shape_fits(128, ROPE, LATENT) and mk.shape_fits(4, ROPE, LATENT)
    assert not mk.shape_fits(40, ROPE, LATENT), "40 heads: no whole blocks of 16"
    assert not mk.shape_fits(16, ROPE, 256)


def test_split_counts_fill_two_waves_within_the_granules_and_the_cap() -> None:
    assert mk.num_splits(1, 1, 384, 132) == 3  # NOTE: 3 granules of 128 keys
    assert mk.num_splits(1, 1, 8192, 132) == mk.MAX_SPLITS
    assert mk.num_splits(64, 1, 8192, 132) == 5 and mk.num_splits(64, 8, 8192, 132) == 1


def test_fa3_mla_yields_the_small_decode_steps_to_the_kernel(monkeypatch) -> None:
    """The ``mla`` table's ``fa3`` row: FA3-MLA (the base) yields the decode steps whose requests
    (one KV head) leave its CTAs short of the SMs; the kernel takes the single-token ones."""
    from graphrt.attention import fa3
    from graphrt.attention.fa3_mla import FA3MLABackend

    assert registry.BACKENDS["mla"]["fa3"] == ("mla_split_decode", "fa3_kernel")
    assert registry.backend_class("mla", "fa3") is FA3MLABackend
    assert "mla_split_decode" in registry.dispatch_parts("mla")
    monkeypatch.setattr(mk, "enabled", lambda device: True)
    base = object.__new__(FA3MLABackend)  # NOTE: no sgl_kernel here: only its yields rule runs
    row = Dispatch("fa3", (MLASplitDecodeBackend(torch.bfloat16), base))
    q_rope, qv, rope, latent, table, seqlens = case(torch.device("cpu"), [5, 40], 16, 16, 64)
    bufs = SimpleNamespace(page_table=table, cache_seqlens=seqlens)
    decode = SimpleNamespace(buffers=bufs, page_size=16, cascade=None, max_seqlen_q=1)
    verify = SimpleNamespace(buffers=bufs, page_size=16, cascade=None, max_seqlen_q=3)
    small, multi = (AttendCall(q_rope, rope, latent, m, SCALE, qv=qv) for m in (decode, verify))  # type: ignore[arg-type]
    monkeypatch.setattr(fa3, "sm_count", lambda device: 132)
    assert row.part_for(small).name == "mla_split_decode" and row.part_for(multi) is base
    monkeypatch.setattr(fa3, "sm_count", lambda device: 2)  # NOTE: 2 requests fill 2 SMs
    assert row.part_for(small) is base


def test_the_kernel_is_offered_for_16_bit_caches_of_its_widths(monkeypatch) -> None:
    cpu = torch.device("cpu")
    need = {"rope_dim": ROPE, "kv_lora_rank": LATENT}
    monkeypatch.setenv("GRAPHRT_DECODE_ATTENTION", "interpret")
    on = INTERPRET and triton is not None
    assert MLASplitDecodeBackend.available(cpu, torch.bfloat16, **need) is on
    assert not MLASplitDecodeBackend.available(cpu, torch.float32, **need)
    assert not MLASplitDecodeBackend.available(cpu, torch.bfloat16, rope_dim=32, kv_lora_rank=256)
    monkeypatch.setenv("GRAPHRT_DECODE_ATTENTION", "0")
    assert not MLASplitDecodeBackend.available(cpu, torch.bfloat16, **need)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or triton is None, reason="no CUDA / Triton")
def test_a_graph_replay_with_new_lengths_equals_eager() -> None:
    """Captured once with PDL on a side stream (warmed up there first, so the last-split merge
    shares that stream's counters), V3's 128 heads, then lengths and pages rewritten in place:
    every replay equals an eager call (no PDL) bit for bit, and the counters read 0 after each."""
    q_rope, qv, rope, latent, table, seqlens = case(torch.device("cuda"), [1, 130, 300, 0], 128, 64, 4096)
    splits = mk.num_splits(4, 8, 4096, torch.cuda.get_device_properties(0).multi_processor_count)
    args = (q_rope, qv, rope, latent, table, seqlens, SCALE, splits)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        mk.mla_decode_attention(*args, True)  # NOTE: compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = mk.mla_decode_attention(*args, True)
    torch.cuda.synchronize()
    for lens in ([300, 0, 1, 4096], [64, 129, 0, 3000], [0, 0, 0, 1]):
        seqlens.copy_(torch.tensor(lens, dtype=torch.int32))
        table.copy_(table.roll(1, 0))  # NOTE: other rows' pages (no row reads past the cache)
        graph.replay()
        eager = mk.mla_decode_attention(*args, False)
        torch.cuda.synchronize()
        assert torch.equal(out, eager), lens
        with torch.cuda.stream(stream):
            assert not scratch.counters(4 * 8, q_rope.device).any(), f"{lens}: counters left at 0"


@pytest.mark.skipif(triton is None or INTERPRET, reason="needs Triton's compiler")
@pytest.mark.parametrize("group", [16, 4])
def test_kernel_compiles_for_hopper_without_spills(group: int) -> None:
    """The launch's geometry through Triton's CUDA compiler for sm_90 (no GPU needed) with PDL:
    ptxas spills nothing at 16 heads a program (V2-Lite, V3's blocks) nor 4, and the last-split
    merge counts arrivals with one acq_rel atomic."""
    from graphrt.attention.split_decode import mla_kernels

    fn = mla_kernels._mla_decode_split
    ptrs = "q_rope qv rope_cache latent_cache page_table seqlens m_out l_out acc_out arrivals out"
    types = "bf16 bf16 bf16 bf16 i32 i32 fp32 fp32 fp32 i32 bf16"
    signature = {name: "*" + t for name, t in zip(ptrs.split(), types.split(), strict=True)}
    ints = "qr_sb qr_sh qv_sb qv_sh rc_sp rc_ss lc_sp lc_ss pt_sb o_sb o_sh"
    signature.update(dict.fromkeys(ints.split(), "i32"))
    signature["scale_log2"] = "fp32"
    constexprs = dict(
        PAGE=64, R=ROPE, D=LATENT, G=group, BLOCK_G=16, BLOCK_N=ml.BLOCK_N, SHARE_N=ml.SHARE_N,
        SPLITS=mk.MAX_SPLITS, PDL=True, F32_DOT=False, MERGE_G=group, CHUNK=max(1, 4096 // (group * LATENT)),
    )  # fmt: skip
    signature.update(dict.fromkeys(constexprs, "constexpr"))
    ptx = sm90_ptx(fn, signature, constexprs, {"num_warps": ml.WARPS})
    assert ptx.count("atom.global.gpu.acq_rel.add") == 1
    assert NO_SPILLS in ptxas_report(ptx)


@rerun_marks
def test_kernel_under_triton_interpreter() -> None:
    """On a CPU box: this file again, with the kernels run by Triton's interpreter."""
    rerun_under_interpreter(__file__, passed=9)

"""The split decode kernel with RoPE and the KV store folded in (``decode_rope_attention``,
``GRAPHRT_DECODE_ROPE``) against ``rope_store`` + the unfused kernel (the two-kernel path).

Kernel cases run on the GPU (``-m gpu``) and on the CPU under ``TRITON_INTERPRET=1`` (Triton's
interpreter: small shapes; a CPU box with Triton reruns this file so, last test). Each case has
real requests on shuffled pages (lengths on and off page and block edges) and pad rows as a
model's: the dummy page, the dummy slot as their slot, the same token at position 0 (identical
q, k, v), one of them with no keys. Checked: the output to the unfused kernel's tolerance, the
caches bit for bit (the dummy slot included), every split count, page sizes 1 and 16.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from graphrt.attention.split_decode import attend as dk
from graphrt.kv import rope_store as rs
from graphrt.models.ops import rope_cos_sin
from graphrt.models.rope import default_inv_freq
from tests.attention.test_decode_kernel import oracle
from tests.support.triton_util import (
    replay_matches_eager,
    rerun_marks,
    rerun_under_interpreter,
    triton_devices,
)

#: As the unfused kernel's tests: bf16 inputs and output, fp32 sums in another order.
ATOL = 2e-2
#: (query heads, KV heads, head dim): Llama-3.2-1B, SmolLM2, MHA, Llama-3-8B.
SHAPES = [(32, 8, 64), (9, 3, 64), (4, 4, 64), (32, 8, 128)]
#: Real lengths, then pad rows (their ``seq_len``: 1 as DECODE pads them, 0 for no keys).
LENS, PAD_LENS = [1, 16, 17, 63, 64, 65, 129, 160], [1, 0, 1]
CPU_SHAPES, CPU_LENS = [(9, 3, 64), (4, 4, 64)], [1, 65, 130]


@dataclass
class Step:
    """One step's inputs: ``q``/``k``/``v`` views of a projection, caches, table, lengths, slots."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cos_sin: torch.Tensor
    loc: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    table: torch.Tensor
    seqlens: torch.Tensor

    def unfused(self, splits: int, pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``rope_store`` + the split kernel on copies of the caches: (out, k cache, v cache)."""
        kc, vc = self.k_cache.clone(), self.v_cache.clone()
        q = rs.rope_store(self.q, self.k, self.v, self.cos_sin, kc, vc, self.loc, pdl=pdl)
        out = dk.decode_attention(q, kc, vc, self.table, self.seqlens, self.q.shape[-1] ** -0.5, splits, pdl)
        return out, kc, vc

    def fused(self, splits: int, pdl: bool = False, copy: bool = True) -> tuple[torch.Tensor, ...]:
        """The fused launch pair (on copies of the caches unless ``copy`` is False)."""
        kc, vc = (self.k_cache.clone(), self.v_cache.clone()) if copy else (self.k_cache, self.v_cache)
        scale = self.q.shape[-1] ** -0.5
        args = (self.q, self.k, self.v, self.cos_sin, self.loc, kc, vc, self.table, self.seqlens)
        return dk.decode_rope_attention(*args, scale, splits, pdl), kc, vc


def make_step(
    device: torch.device,
    lens: list[int],
    shape: tuple[int, int, int],
    page: int,
    seed: int = 0,
    max_pages: int = 0,
) -> Step:
    """Real rows on shuffled pages (page 0 is the dummy page, slot 0 the dummy slot), then the
    pad rows of :data:`PAD_LENS`; caches random (stale values at every slot written)."""
    heads, hk, d = shape
    gen = torch.Generator().manual_seed(seed)
    all_lens = lens + PAD_LENS
    b, max_pages = len(all_lens), max(max_pages, -(-max(lens) // page))
    perm = torch.randperm(len(lens) * max_pages, generator=gen) + 1
    table = torch.zeros(b, max_pages, dtype=torch.int32)
    table[: len(lens)] = perm.view(len(lens), max_pages).to(torch.int32)
    pos = torch.tensor([max(n - 1, 0) for n in all_lens])
    loc = table[torch.arange(b), pos // page].long() * page + pos % page  # NOTE: pad rows: slot 0
    qkv = torch.randn(b, (heads + 2 * hk) * d, generator=gen)
    qkv[len(lens) :] = qkv[len(lens)]  # NOTE: pad rows are one token at one position
    cache = (len(lens) * max_pages + 1, page, hk, d)
    dtype = torch.bfloat16
    qkv, kc, vc = (
        t.to(device, dtype)
        for t in (qkv, torch.randn(cache, generator=gen), torch.randn(cache, generator=gen))
    )
    q, k, v = qkv.split((heads * d, hk * d, hk * d), dim=-1)
    cos_sin = rope_cos_sin(pos.to(device), default_inv_freq(500000.0, d).to(device), dtype)
    seqlens = torch.tensor(all_lens, dtype=torch.int32, device=device)
    views = (q.view(b, heads, d), k.view(b, hk, d), v.view(b, hk, d))
    return Step(*views, cos_sin, loc.to(device), kc, vc, table.to(device), seqlens)


def check_one(step: Step, splits: int, pdl: bool = False) -> None:
    want, want_k, want_v = step.unfused(splits, pdl)
    got, got_k, got_v = step.fused(splits, pdl)
    assert got.shape == step.q.shape and got.dtype == step.q.dtype
    assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v), f"{splits} splits: caches differ"
    torch.testing.assert_close(
        got.float(), want.float(), atol=ATOL, rtol=ATOL, msg=lambda m: f"{splits}: {m}"
    )
    assert got[-2].abs().max() == 0, "the row without keys gets zeros"
    assert torch.equal(got[-3], got[-1]), "pad rows (one token at one position) agree"


@pytest.mark.parametrize("device", triton_devices())
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("merge_last", ["1", "0"])
def test_fused_matches_rope_store_then_attend(
    device: torch.device, shape, page: int, merge_last: str, monkeypatch
) -> None:
    """With either merge (``GRAPHRT_DECODE_MERGE_LAST``; the interpreter runs the default's)."""
    monkeypatch.setenv(dk.MERGE_LAST_ENV, merge_last)
    if device.type == "cpu":
        if merge_last == "0":
            pytest.skip("the interpreter runs the default merge (the merge launch: test_decode_merge)")
        if shape not in CPU_SHAPES:
            pytest.skip("the interpreter runs the small shapes")
        monkeypatch.setenv(rs.ENV, "interpret")
    lens = LENS if device.type == "cuda" else CPU_LENS
    step = make_step(device, lens, shape, page)
    sms = 132 if device.type == "cpu" else torch.cuda.get_device_properties(device).multi_processor_count
    every = {1, 2, 3, dk.num_splits(step.q.shape[0], shape[1], max(lens), sms), 7}
    for splits in sorted(every) if device.type == "cuda" else (1, 3):  # NOTE: the interpreter is slow
        check_one(step, splits)
    rotated = rs.rotate_ref(step.q, step.cos_sin)  # NOTE: and a float64 oracle over the new cache
    _, kc, vc = step.unfused(1)
    expected = oracle(rotated, kc, vc, step.table, step.seqlens, shape[2] ** -0.5)
    torch.testing.assert_close(step.fused(3)[0].double().cpu(), expected, atol=ATOL, rtol=ATOL)
    untouched = torch.ones(step.k_cache.shape[0] * step.k_cache.shape[1], dtype=torch.bool, device=device)
    untouched[step.loc] = False
    _, kc, vc = step.fused(3)
    assert torch.equal(kc.flatten(0, 1)[untouched], step.k_cache.flatten(0, 1)[untouched])
    assert torch.equal(vc.flatten(0, 1)[untouched], step.v_cache.flatten(0, 1)[untouched])


GPU = pytest.mark.skipif(not (torch.cuda.is_available() and dk.triton is not None), reason="no CUDA / Triton")


@pytest.mark.gpu
@GPU
@pytest.mark.parametrize("page", [1, 16])
def test_a_graph_replay_reads_new_lengths_pages_and_slots_in_place(page: int) -> None:
    """Captured once with PDL; then the inputs, lengths, page table and slots rewritten in place
    (a new step): each replay equals the eager launches (no PDL) bit for bit, caches included."""
    device = torch.device("cuda")
    step = make_step(device, [30, 70, 5], (32, 8, 64), page, max_pages=80 // page)
    splits = dk.num_splits(6, 8, 80, torch.cuda.get_device_properties(device).multi_processor_count)
    step.fused(splits, pdl=True)  # NOTE: compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, _, _ = step.fused(splits, pdl=True, copy=False)
    for seed, lens in enumerate(([31, 71, 6], [64, 1, 80], [2, 33, 17]), start=1):
        new = make_step(device, lens, (32, 8, 64), page, seed, max_pages=80 // page)
        for name in ("q", "k", "v", "cos_sin", "loc", "table", "seqlens"):
            getattr(step, name).copy_(getattr(new, name))
        want, want_k, want_v = step.fused(splits)
        graph.replay()
        assert (
            torch.equal(out, want) and torch.equal(step.k_cache, want_k) and torch.equal(step.v_cache, want_v)
        )
        check_one(step, splits)


@pytest.mark.gpu
@GPU
def test_pdl_chains_in_a_graph_match_eager() -> None:
    """qkv GEMM -> rope_store -> split + merge, and qkv GEMM -> the fused pair, all with PDL in a
    graph: each replay equals eager launches without PDL (a launch that read q, k or v before the
    GEMM finished, or the cache before rope_store did, would differ)."""
    from graphrt.kernels import skinny as sk

    device = torch.device("cuda")
    step = make_step(device, [40, 100, 7], (32, 8, 64), 16)
    heads, hk, d = 32, 8, 64
    x = torch.zeros(step.q.shape[0], 2048, dtype=torch.bfloat16, device=device)
    w = (torch.randn((heads + 2 * hk) * d, 2048, device=device) * 2048**-0.5).bfloat16()
    copies = [(step.k_cache.clone(), step.v_cache.clone()) for _ in range(2)]
    real = 3  # NOTE: pad rows share the dummy slot: they must project the same token, as a model's do

    def run(pdl: bool) -> tuple[torch.Tensor, ...]:
        rows = torch.cat((x[:real], x[real : real + 1].expand(x.shape[0] - real, -1)))
        q, k, v = sk.skinny_linear(rows, w, pdl=pdl).split((heads * d, hk * d, hk * d), dim=-1)
        q, k, v = q.view(-1, heads, d), k.view(-1, hk, d), v.view(-1, hk, d)
        outs = []
        for rope, (kc, vc) in zip((False, True), copies, strict=True):
            args = (step.table, step.seqlens, d**-0.5, 4, pdl)
            if rope:
                outs.append(dk.decode_rope_attention(q, k, v, step.cos_sin, step.loc, kc, vc, *args))
            else:
                rotated = rs.rope_store(q, k, v, step.cos_sin, kc, vc, step.loc, pdl=pdl)
                outs.append(dk.decode_attention(rotated, kc, vc, *args))
        return tuple(outs)

    replay_matches_eager(run, x)
    assert torch.equal(copies[0][0], copies[1][0]) and torch.equal(copies[0][1], copies[1][1])


def test_only_what_the_kernel_takes_folds_rope_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """``rope_takes`` on CPU tensors with the kernel forced on: a DECODE step of 16-bit tensors
    as the projection gives them; not an FP8 cache, a window, sinks, unpacked heads, fp32 angles,
    a multi-token step, nor without ``GRAPHRT_DECODE_ROPE=1`` (off by default)."""
    from graphrt.kv.quant import FP8
    from tests.support.paged_util import paged_case

    monkeypatch.setattr(dk, "enabled", lambda device: True)
    monkeypatch.setattr(dk, "sm_count", lambda device: 132)
    monkeypatch.setenv(dk.ROPE_ENV, "1")
    decode = paged_case(torch.device("cpu"), 16, 96, [5, 40, 96], [1, 1, 1])
    qkv = torch.randn(3, 12 * 64, dtype=torch.bfloat16)
    q, k, v = (t.view(3, -1, 64) for t in qkv.split((8 * 64, 2 * 64, 2 * 64), dim=-1))
    kc, vc, cos_sin = decode.k_cache.bfloat16(), decode.v_cache.bfloat16(), torch.randn(3, 64).bfloat16()
    unpacked = torch.randn(3, 2, 128).bfloat16()[:, :, :64]  # NOTE: heads 128 apart

    def takes(*tensors: torch.Tensor, meta=decode.meta, options=()) -> bool:
        return dk.rope_takes(*tensors, meta, *options)

    assert takes(q, k, v, cos_sin, kc, vc) and takes(q, k, v, cos_sin, kc, vc, options=(None, None, None))
    assert not takes(q, k, v, cos_sin, kc.to(FP8), vc.to(FP8))
    assert not takes(q, k, v, cos_sin, kc, vc, options=(32,))  # NOTE: a window keeps rope_store + FA3
    assert not takes(q, k, v, cos_sin, kc, vc, options=(None, torch.zeros(8)))
    assert not takes(q, unpacked, v, cos_sin, kc, vc)
    assert not takes(q, k, v, cos_sin.float(), kc, vc)
    extend = paged_case(torch.device("cpu"), 16, 96, [5, 40, 96], [5, 7, 30])
    assert not takes(q, k, v, cos_sin, kc, vc, meta=extend.meta)
    monkeypatch.setenv(dk.ROPE_ENV, "0")
    assert not takes(q, k, v, cos_sin, kc, vc)
    monkeypatch.delenv(dk.ROPE_ENV)
    assert not takes(q, k, v, cos_sin, kc, vc), "off by default"


@rerun_marks
def test_kernel_under_triton_interpreter() -> None:
    """On a CPU box: this file again, with the kernels run by Triton's interpreter."""
    rerun_under_interpreter(__file__, passed=5)

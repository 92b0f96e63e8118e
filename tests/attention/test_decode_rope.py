"""RoPE and the KV store fused into the split decode launch (``decode_attention`` given the new
keys; the backend's ``fuses_store``) against the pair it replaces: ``rope_store``'s kernel, then
the split decode kernel on the rotated q.

Runs on the GPU (``-m gpu``) and on the CPU under ``TRITON_INTERPRET=1`` (a CPU box with Triton
reruns this file so, last test). Checked, over GQA groups, a sliding window with sinks, split
counts past the key blocks, pad rows (seqlen 1, all at the dummy slot, as the runtime pads a
decode step) and rows of 1 and 0 keys: the caches afterwards bit-equal to ``rope_store``'s (k
rotated and v copied at ``loc``, nothing else written) and the projection untouched; the output
bit-equal to the pair's under the interpreter (both round q alike) and within one bf16 step on
the GPU (the rotations' fused multiply-adds may differ). Which calls fuse and which keep
``rope_store``; a tiny Llama's graphed decode, fused, gives the unfused run's tokens.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from graphrt.attention.call import AttendCall, FreshKV
from graphrt.attention.context import ForwardContext
from graphrt.attention.dispatch import Dispatch
from graphrt.attention.reference import ReferenceBackend
from graphrt.attention.split_decode import attend as dk
from graphrt.attention.split_decode.backend import SplitDecodeBackend
from graphrt.attention.store import rotate_and_store
from graphrt.kv import rope_store as rs
from graphrt.models.ops import rope_cos_sin
from graphrt.models.rope import default_inv_freq
from tests.support import conformance
from tests.support.paged_util import paged_case
from tests.support.triton_util import (
    INTERPRET,
    replay_matches_eager,
    rerun_marks,
    rerun_under_interpreter,
    triton_devices,
)
from tests.support.util import prefill

PAGE = 16
#: One bf16 step at 1 (the outputs are averages of unit-scale values): the GPU's tolerance.
BF16_STEP = 2**-7
#: Keys per real row: on and off page and block edges, one key, none.
LENS = [1, 70, 0, 33, 130]
PADS = 2
#: Prefilled rows of the chunked-local model test: a verify chain before, across and past the
#: chunk edge 32 of tiny-llama-local.
LOCAL_LENS = [30, 31, 45]


def case(
    device: torch.device, heads: int, heads_k: int, d: int = 64, seed: int = 0, pads: int = PADS
) -> SimpleNamespace:
    """A decode step of :data:`LENS` rows and ``pads`` pad rows: ``q``, ``k``, ``v`` views of
    one projection (pad rows: the same pad token's), caches, table (page 0 the dummy page, each
    real row its own shuffled pages), lengths, ``cos_sin`` at each row's newest position and
    ``loc`` its slot (a row without keys: a page of its own; pad rows: the dummy slot 0)."""
    gen = torch.Generator().manual_seed(seed)
    lens = LENS + [1] * pads
    need = [max(1, -(-n // PAGE)) for n in LENS]
    pages = (torch.randperm(sum(need), generator=gen) + 1).split(need)
    table = torch.zeros(len(lens), max(need), dtype=torch.int32)
    loc = torch.zeros(len(lens), dtype=torch.int64)
    for i, (n, own) in enumerate(zip(LENS, pages, strict=True)):
        table[i, : len(own) if n else 0] = own[: len(own) if n else 0].to(torch.int32)
        loc[i] = own[(n - 1) // PAGE] * PAGE + (n - 1) % PAGE if n else own[0] * PAGE
    cache = (sum(need) + 1, PAGE, heads_k, d)
    k_cache, v_cache = torch.randn(cache, generator=gen), torch.randn(cache, generator=gen)
    qkv = torch.randn(len(lens), (heads + 2 * heads_k) * d, generator=gen)
    qkv[len(LENS) :] = qkv[-1]  # NOTE: every pad row projects the same pad token
    positions = torch.tensor([max(n - 1, 0) for n in lens])
    cos_sin = rope_cos_sin(positions, default_inv_freq(10000.0, d), torch.bfloat16).to(device)
    qkv, k_cache, v_cache = (t.to(device, torch.bfloat16) for t in (qkv, k_cache, v_cache))
    q, k, v = qkv.split((heads * d, heads_k * d, heads_k * d), dim=-1)
    q, k, v = q.view(-1, heads, d), k.view(-1, heads_k, d), v.view(-1, heads_k, d)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    return SimpleNamespace(
        qkv=qkv, q=q, k=k, v=v, k_cache=k_cache, v_cache=v_cache, table=table.to(device),
        seqlens=seqlens, cos_sin=cos_sin, loc=loc.to(device),
    )  # fmt: skip


def unfused(c: SimpleNamespace, splits: int, window: int | None, sinks: torch.Tensor | None):
    """``rope_store`` (its kernel), then the split decode kernel: output and caches."""
    kc, vc = c.k_cache.clone(), c.v_cache.clone()
    q = rs.rope_store(c.q, c.k, c.v, c.cos_sin, kc, vc, c.loc, pdl=False)
    args = (c.table, c.seqlens, c.q.shape[-1] ** -0.5, splits, False, window, sinks)
    return dk.decode_attention(q, kc, vc, *args), kc, vc


def fused(c: SimpleNamespace, splits: int, window: int | None, sinks: torch.Tensor | None):
    """The one launch given the new keys: output and caches."""
    kc, vc = c.k_cache.clone(), c.v_cache.clone()
    args = (c.table, c.seqlens, c.q.shape[-1] ** -0.5, splits, False, window, sinks)
    return dk.decode_attention(c.q, kc, vc, *args, c.k, c.v, c.cos_sin, c.loc), kc, vc


@pytest.mark.parametrize("device", triton_devices())
@pytest.mark.parametrize(("heads", "heads_k", "d"), [(9, 3, 64), (8, 2, 64), (4, 4, 128)])
@pytest.mark.parametrize("options", [False, True])
def test_the_fused_launch_equals_rope_store_then_the_kernel(device, heads, heads_k, d, options, monkeypatch):
    """``options``: gpt-oss's layers (a 20-key sliding window and a sink per head)."""
    if device.type == "cpu":
        monkeypatch.setenv(rs.ENV, "interpret")  # NOTE: rope_store's kernel: the bits to equal
    c = case(device, heads, heads_k, d)
    window = 20 if options else None
    sinks = torch.randn(heads, generator=torch.Generator().manual_seed(1)).to(device, torch.bfloat16)
    sinks = sinks if options else None
    before = c.qkv.clone()
    for splits in (1, 3, 9):
        want, want_k, want_v = unfused(c, splits, window, sinks)
        got, got_k, got_v = fused(c, splits, window, sinks)
        assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v), f"{splits}: the caches differ"
        real = slice(0, len(LENS))  # NOTE: pad rows attend the dummy slot, equal too but unchecked on GPU
        if device.type == "cpu":
            assert torch.equal(got, want), f"{splits} splits: the output differs"
        else:
            torch.testing.assert_close(got[real], want[real], atol=BF16_STEP, rtol=BF16_STEP)
        assert got[LENS.index(0)].abs().max() == 0, "a row without keys gets zeros"
    assert torch.equal(c.qkv, before), "the projection is read, never written"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or dk.triton is None, reason="no CUDA / Triton")
def test_a_graph_replay_with_pdl_equals_eager() -> None:
    """Captured with PDL (the caches reset from a copy in the graph, then the fused launch), the
    projection rewritten in place: each replay's output and caches equal an eager launch's (no
    PDL) bit for bit. No pad rows: new projections would give them different keys for one slot."""
    c = case(torch.device("cuda"), 32, 8, 64, pads=0)
    kc, vc = c.k_cache.clone(), c.v_cache.clone()
    splits = dk.num_splits(len(LENS), 8, c.table.shape[1] * PAGE, dk.sms(kc.device))

    def run(pdl: bool) -> tuple[torch.Tensor, ...]:
        kc.copy_(c.k_cache)
        vc.copy_(c.v_cache)
        args = (c.table, c.seqlens, 0.125, splits, pdl, None, None, c.k, c.v, c.cos_sin, c.loc)
        return dk.decode_attention(c.q, kc, vc, *args), kc.clone(), vc.clone()

    replay_matches_eager(run, c.qkv)


def test_the_new_keys_come_all_four_or_none() -> None:
    c = case(torch.device("cpu"), 4, 2)
    with pytest.raises(ValueError, match=r"k_new, v_new, cos_sin and loc together; given: k_new, loc"):
        dk.decode_attention(
            c.q, c.k_cache, c.v_cache, c.table, c.seqlens, 0.125, 2, False, k_new=c.k, loc=c.loc
        )


class _Yields(ReferenceBackend):
    """A dispatch base that yields every step (FA3 at a small bucket)."""

    def yields(self, call: AttendCall) -> bool:
        return True


def test_only_split_decode_steps_fuse_the_store(monkeypatch) -> None:
    """The split decode backend fuses a decode step it takes, with 16-bit packed new keys; not
    a prefill, an FP8 cache, another dtype, nor with ``rope_store`` switched to torch; a dispatch
    fuses where its split decode part takes the step; the other backends never."""
    monkeypatch.setattr(dk, "enabled", lambda device: True)
    decode = paged_case(torch.device("cpu"), PAGE, 96, [5, 40, 96], [1, 1, 1])
    q, k_cache, v_cache = decode.q.bfloat16(), decode.k_cache.bfloat16(), decode.v_cache.bfloat16()
    qkv = torch.randn(3, (q.shape[1] + 2 * k_cache.shape[2]) * q.shape[2]).bfloat16()
    _, k, v = qkv.split((q[0].numel(), k_cache[0, 0].numel(), k_cache[0, 0].numel()), dim=-1)
    k, v = k.view(3, -1, q.shape[2]), v.view(3, -1, q.shape[2])
    cos_sin = torch.randn(3, q.shape[2]).bfloat16()
    fresh = FreshKV(k, v, cos_sin, decode.meta.buffers.out_cache_loc)
    call = AttendCall(q, k_cache, v_cache, decode.meta, 0.125, fresh=fresh)
    split = SplitDecodeBackend()
    assert split.fuses_store(call)
    extend = paged_case(torch.device("cpu"), PAGE, 96, [5, 40, 96], [5, 7, 30])
    prefill = AttendCall(extend.q.bfloat16(), k_cache, v_cache, extend.meta, 0.125, fresh=fresh)
    assert not split.fuses_store(prefill)
    assert not split.fuses_store(AttendCall(q, k_cache, v_cache, decode.meta, 0.125))
    fp8 = AttendCall(q, k_cache, v_cache, decode.meta, 0.125, kv_scales=object(), fresh=fresh)  # type: ignore[arg-type]
    assert not split.fuses_store(fp8)
    other = FreshKV(k, v, cos_sin.float(), fresh.loc)
    assert not split.fuses_store(AttendCall(q, k_cache, v_cache, decode.meta, 0.125, fresh=other))
    assert not ReferenceBackend().fuses_store(call)
    assert Dispatch("fa3-like", (split, _Yields())).fuses_store(call)
    assert not Dispatch("fa3-like", (split, ReferenceBackend())).fuses_store(call), "the base keeps it"
    monkeypatch.setenv(rs.ENV, "0")
    assert not split.fuses_store(call), "rope_store switched to torch: no fused store"


def test_a_virtual_batch_never_fuses_the_store(monkeypatch) -> None:
    """A chunked-local layer's rows are query tokens, siblings of one request among them, each
    reading the others' new keys: ``rotate_and_store(own_rows=False)`` leaves the call without
    the new keys, ``q`` rotated and the keys stored by ``rope_store``, even where the backend
    would fuse (``own_rows=True``)."""
    monkeypatch.setattr(dk, "enabled", lambda device: True)
    case = paged_case(torch.device("cpu"), PAGE, 96, [5, 40, 96], [1, 1, 1])
    q, k_cache, v_cache = case.q.bfloat16(), case.k_cache.bfloat16(), case.v_cache.bfloat16()
    k, v = (
        torch.randn(3, k_cache.shape[2], q.shape[2]).bfloat16(),
        torch.randn(3, k_cache.shape[2], q.shape[2]).bfloat16(),
    )
    cos_sin = torch.randn(3, q.shape[2]).bfloat16()
    loc = case.meta.buffers.out_cache_loc
    fresh = FreshKV(k, v, cos_sin, loc)
    call = AttendCall(q, k_cache, v_cache, case.meta, 0.125)
    split = SplitDecodeBackend()
    assert rotate_and_store(split, call, fresh).fresh is fresh
    got = rotate_and_store(split, call, fresh, own_rows=False)
    assert got.fresh is None
    torch.testing.assert_close(got.q, rs.rotate_ref(q, cos_sin), atol=0, rtol=0)
    flat_k = k_cache.view(-1, *k_cache.shape[2:])
    torch.testing.assert_close(flat_k[loc], rs.rotate_ref(k, cos_sin), atol=0, rtol=0)
    torch.testing.assert_close(v_cache.view(-1, *v_cache.shape[2:])[loc], v, atol=0, rtol=0)


@pytest.mark.skipif(dk.triton is None or not INTERPRET, reason="the CPU model under the interpreter only")
def test_a_graphed_decode_step_fused_gives_the_unfused_tokens(monkeypatch) -> None:
    """tiny-llama in bf16 on the split decode backend (the interpreter): the decode layers fuse
    the store (the backend said so while the graph was captured); the replayed step's logits
    within the conformance suite's bf16 bound of the unfused run's (``rope_store`` switched to
    torch, then the kernel) and of the reference backend's, the unfused run's tokens."""
    cpu, f = torch.device("cpu"), conformance.FEATURES["decode"]
    monkeypatch.setenv(dk.ENV, "interpret")
    seen: list[bool] = []
    real = SplitDecodeBackend.fuses_store

    def spy(self: SplitDecodeBackend, call: AttendCall) -> bool:
        seen.append(real(self, call))
        return seen[-1]

    monkeypatch.setattr(SplitDecodeBackend, "fuses_store", spy)
    got = conformance.step(conformance.setup(cpu, f, "split_decode", torch.bfloat16), f)
    assert any(seen), "no layer fused the store"
    monkeypatch.setenv(rs.ENV, "0")
    seen.clear()
    want = conformance.step(conformance.setup(cpu, f, "split_decode", torch.bfloat16), f)
    assert seen and not any(seen)
    oracle = conformance.step(conformance.setup(cpu, f, "reference", torch.bfloat16), f)
    for name, other in (("the unfused run's", want), ("the reference's", oracle)):
        err = ((got.float() - other.float()).norm() / other.float().norm()).item()
        assert err <= 2e-2, f"logits differ from {name} by {err:.3g}"
    assert torch.equal(got.float().argmax(-1), want.float().argmax(-1)), "tokens differ"


def _local_step(f: conformance.Feature, backend: str, monkeypatch: pytest.MonkeyPatch) -> torch.Tensor:
    """tiny-llama-local in bf16 (``f``'s runtime, built with the kernel on), rows 0-2 prefilled
    to :data:`LOCAL_LENS`, then one graphed step of ``f.mode`` over them."""
    monkeypatch.setenv(dk.ENV, "interpret")
    s, rng = conformance.setup(torch.device("cpu"), f, backend, torch.bfloat16), np.random.default_rng(5)
    # NOTE: the eager prefill's virtual rows on torch: the interpreter's time goes to the step
    monkeypatch.setenv(dk.ENV, "0")
    prefill(s, [0, 1, 2], LOCAL_LENS, rng)
    monkeypatch.setenv(dk.ENV, "interpret")
    out = s.runtime.run(conformance.batch(s, f, [0, 1, 2], LOCAL_LENS, rng))
    assert sum(s.runtime.stats().replays.values()) == 1, "the step did not replay a graph"
    return out


@pytest.mark.skipif(dk.triton is None or not INTERPRET, reason="the CPU model under the interpreter only")
@pytest.mark.parametrize("mode", [conformance.M.DECODE, conformance.M.TARGET_VERIFY])
def test_a_chunked_local_model_keeps_rope_store_on_its_local_layers(monkeypatch, mode) -> None:
    """tiny-llama-local (chunk 32) on the split decode backend (the interpreter), graphed: the
    kernel attends every local layer's virtual batch (in a verify step, a request's chain of
    sibling rows, two of them across the edge 32) with the keys stored by ``rope_store`` first,
    never fused, while a global layer's decode step fuses; the logits within the conformance
    suite's bf16 bound of the reference backend's."""
    f = dataclasses.replace(conformance.FEATURES["chunked_local"], mode=mode)
    chunk: list[int | None] = [None]
    seen: list[tuple[int | None, bool]] = []
    attention, attend = ForwardContext.attention, dk.attend

    def layer(self: ForwardContext, layer_id: int, *args, **kw) -> torch.Tensor:
        chunk[0] = kw.get("chunk")
        return attention(self, layer_id, *args, **kw)

    def kernel(q, k_cache, v_cache, meta, scale, window=None, sinks=None, fresh=None) -> torch.Tensor:
        seen.append((chunk[0], fresh is not None))
        return attend(q, k_cache, v_cache, meta, scale, window, sinks, fresh)

    monkeypatch.setattr(ForwardContext, "attention", layer)
    monkeypatch.setattr(dk, "attend", kernel)
    got = _local_step(f, "split_decode", monkeypatch)
    local = [fused for c, fused in seen if c is not None]
    assert local and not any(local), f"local layers' calls fused: {local}"
    if mode is conformance.M.DECODE:  # NOTE: a verify step's global layers: a chain, never fused
        assert all(fused for c, fused in seen if c is None) and len(seen) > len(local), "no fused layer"
    want = _local_step(f, "reference", monkeypatch)
    err = ((got.float() - want.float()).norm() / want.float().norm()).item()
    assert err <= 2e-2, f"logits differ from the reference's by {err:.3g}"


@rerun_marks
def test_kernel_under_triton_interpreter() -> None:
    """On a CPU box: this file again, with the kernels run by Triton's interpreter."""
    rerun_under_interpreter(__file__, passed=12)

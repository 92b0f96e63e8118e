"""Dense MLA's fused prologue (``graphrt.kv.latent_store``): the Triton kernel against the torch
ops it replaces (the model's RoPE of either layout, ``rms_norm_ref``, the cache's store).

Runs on the GPU (``-m gpu``) and on the CPU under ``TRITON_INTERPRET=1`` (Triton's
interpreter); the refusals run everywhere.
"""

from __future__ import annotations

import pytest
import torch

from graphrt.kv import latent_store as ls
from graphrt.kv.rope_store import rotate_ref
from graphrt.models.mla import LATENT_NORM_EPS, rotate_interleaved
from graphrt.models.ops import rms_norm_ref, rope_cos_sin
from graphrt.models.rope import default_inv_freq
from tests.support.triton_util import (
    INTERPRET,
    NO_SPILLS,
    ptxas_report,
    rerun_marks,
    rerun_under_interpreter,
    sm90_ptx,
    triton_devices,
)

PAGES, PAGE_SIZE = 12, 4


def _inputs(device: torch.device, dtype: torch.dtype, tokens: int, heads: int, nope: int, rope: int, c: int):
    """q and kv as views of projection outputs (kv's token stride wider than its row), norm
    weight, cos/sin, both caches (random: untouched slots must stay), slots of stride 3."""
    gen = torch.Generator().manual_seed(tokens * 1000 + heads * 10 + rope)
    q = torch.randn(tokens, heads * (nope + rope), generator=gen).to(device, dtype).view(tokens, heads, -1)
    kv = torch.randn(tokens, c + rope + 8, generator=gen).to(device, dtype)[:, : c + rope]
    kv[:, :c] *= 3.0  # NOTE: a latent of RMS 3, so the norm does work
    weight = (1 + 0.5 * torch.randn(c, generator=gen)).to(device, dtype)
    positions = torch.randint(0, 70000, (tokens,), generator=gen).to(device)
    cos_sin = rope_cos_sin(positions, default_inv_freq(10000.0, rope).to(device), dtype)
    rope_cache = torch.randn(PAGES, PAGE_SIZE, 1, rope, generator=gen).to(device, dtype)
    latent_cache = torch.randn(PAGES, PAGE_SIZE, 1, c, generator=gen).to(device, dtype)
    loc = torch.randperm(PAGES * PAGE_SIZE, generator=gen)[: tokens * 3].to(device).view(tokens, 3)[:, 1]
    return q, kv, weight, cos_sin, rope_cache, latent_cache, loc


def _expected(q, kv, weight, cos_sin, rope_cache, latent_cache, loc, interleave: bool):
    """The model's torch path: rotated q_rope, and both caches with the token's slots written."""
    rope, c = cos_sin.shape[-1], latent_cache.shape[-1]
    rotate = rotate_interleaved if interleave else rotate_ref
    rope_cache, latent_cache = rope_cache.clone(), latent_cache.clone()
    rope_cache.view(-1, rope).index_copy_(0, loc, rotate(kv[:, None, c:], cos_sin)[:, 0])
    latent_cache.view(-1, c).index_copy_(0, loc, rms_norm_ref(kv[:, :c], weight, LATENT_NORM_EPS))
    return rotate(q[..., -rope:], cos_sin), rope_cache, latent_cache


@pytest.mark.parametrize("device", triton_devices())
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("interleave", [True, False])
@pytest.mark.parametrize(
    ("tokens", "heads", "nope", "rope", "c"),
    [(1, 16, 128, 64, 512), (5, 3, 16, 8, 24), (7, 9, 8, 12, 40), (2, 1, 0, 4, 16)],
)
def test_kernel_matches_torch(monkeypatch, device, dtype, interleave, tokens, heads, nope, rope, c) -> None:
    if device.type == "cpu":
        monkeypatch.setenv(ls.ENV, "interpret")
    inputs = _inputs(device, dtype, tokens, heads, nope, rope, c)
    q, kv, weight, cos_sin, rope_cache, latent_cache, loc = inputs
    assert ls.enabled(device) and ls.fits(q, kv, cos_sin, weight, rope_cache, latent_cache)
    want_q, want_rope, want_latent = _expected(*inputs, interleave)
    q_before, kv_before = q.clone(), kv.clone()
    got = ls.rope_norm_store(
        q, kv, cos_sin, weight, LATENT_NORM_EPS, rope_cache, latent_cache, loc, interleave
    )
    assert got.is_contiguous() and got.shape == (tokens, heads, rope) and got.dtype == dtype
    if device.type == "cpu" and dtype == torch.float16:
        # NOTE: the interpreter's float32 math is numpy's, as torch's on the CPU: same bits
        # (its bf16 cast truncates instead of rounding, so bf16 gets the tolerance below)
        assert torch.equal(got, want_q) and torch.equal(rope_cache, want_rope)
        assert torch.equal(latent_cache, want_latent)
    # NOTE: one rounding to 16 bits on both sides; the float32 sums may differ in order / FMA
    torch.testing.assert_close(got, want_q, rtol=2**-7, atol=1e-3)
    torch.testing.assert_close(rope_cache, want_rope, rtol=2**-7, atol=1e-3)
    torch.testing.assert_close(latent_cache, want_latent, rtol=2**-7, atol=1e-3)
    untouched = torch.ones(PAGES * PAGE_SIZE, dtype=torch.bool, device=device)
    untouched[loc] = False
    for cache, want in ((rope_cache, want_rope), (latent_cache, want_latent)):
        assert torch.equal(
            cache.view(PAGES * PAGE_SIZE, -1)[untouched], want.view(PAGES * PAGE_SIZE, -1)[untouched]
        )
    assert torch.equal(q, q_before) and torch.equal(kv, kv_before), "inputs are read, never written"


@pytest.mark.parametrize("device", triton_devices())
def test_no_tokens_writes_nothing(monkeypatch, device) -> None:
    if device.type == "cpu":
        monkeypatch.setenv(ls.ENV, "interpret")
    q, kv, weight, cos_sin, rope_cache, latent_cache, loc = _inputs(device, torch.bfloat16, 3, 2, 8, 8, 16)
    before = rope_cache.clone(), latent_cache.clone()
    got = ls.rope_norm_store(
        q[:0], kv[:0], cos_sin[:0], weight, 1e-6, rope_cache, latent_cache, loc[:0], True
    )
    assert got.shape == (0, 2, 8)
    assert torch.equal(rope_cache, before[0]) and torch.equal(latent_cache, before[1])


def test_refuses_what_it_does_not_take() -> None:
    q, kv, weight, cos_sin, rope_cache, latent_cache, loc = _inputs(
        torch.device("cpu"), torch.bfloat16, 3, 2, 8, 8, 16
    )
    assert ls.fits(q, kv, cos_sin, weight, rope_cache, latent_cache)
    fp32 = rope_cache.float(), latent_cache.float()
    assert not ls.fits(q, kv, cos_sin, weight, *fp32), "an fp32 cache keeps the torch path"
    assert not ls.fits(q, kv, cos_sin, weight[:-1], rope_cache, latent_cache)
    assert not ls.fits(q, kv, cos_sin[:, :6], weight, rope_cache, latent_cache)
    with pytest.raises(ValueError, match=r"caches torch.float32 \(12, 4, 1, 8\)"):
        ls.rope_norm_store(q, kv, cos_sin, weight, 1e-6, *fp32, loc, True)


@pytest.mark.skipif(INTERPRET or ls.triton is None, reason="needs Triton's compiler, not its interpreter")
@pytest.mark.parametrize("heads", [16, 128], ids=["v2-lite", "v3"])
@pytest.mark.parametrize("interleave", [True, False])
def test_compiles_for_sm90_with_pdl_and_no_spills(heads: int, interleave: bool) -> None:
    """DeepSeek's shapes (nope 128, rope 64, latent 512) build for sm_90, wait on the
    projections with PDL and spill no register (no GPU needed)."""
    fn = ls._mla_store
    constexprs = dict(
        H=heads,
        NOPE=128,
        HALF=32,
        C=512,
        BLOCK_H=heads,
        BLOCK_D=32,
        BLOCK_C=512,
        INTERLEAVE=interleave,
        PDL=True,
    )
    ints = {"q_stride", "q_head_stride", "kv_stride", "cs_stride", "loc_stride"}
    signature = {
        a: "constexpr" if a in constexprs else "i32" if a in ints else "fp32" if a == "eps" else "*bf16"
        for a in fn.arg_names
    }
    ptx = sm90_ptx(fn, signature | {"loc": "*i64"}, constexprs, {"num_warps": 4})
    assert "griddepcontrol.wait" in ptx and "griddepcontrol.launch_dependents" in ptx
    assert NO_SPILLS in ptxas_report(ptx)


@rerun_marks
def test_kernel_under_triton_interpreter() -> None:
    """On a CPU box: this file again, with the kernel run by Triton's interpreter."""
    rerun_under_interpreter(__file__, passed=18)

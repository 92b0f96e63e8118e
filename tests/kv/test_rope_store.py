"""RoPE + KV store (``graphrt.kv.rope_store``): the Triton kernel against its torch oracle.

Runs on the GPU (``-m gpu``) and on the CPU under ``TRITON_INTERPRET=1`` (Triton's
interpreter); the torch path runs everywhere.
"""

from __future__ import annotations

import pytest
import torch

from graphrt.kv import rope_store as rs
from graphrt.models.ops import rope_cos_sin
from graphrt.models.rope import default_inv_freq
from tests.support.triton_util import rerun_marks, rerun_under_interpreter, triton_devices


def _inputs(device: torch.device, dtype: torch.dtype, tokens: int, hq: int, hk: int, d: int):
    """q, k, v as views of one projection output (token stride = its width), caches, slots."""
    gen = torch.Generator().manual_seed(tokens * 100 + hq)
    qkv = torch.randn(tokens, (hq + 2 * hk) * d, generator=gen).to(device, dtype)
    q, k, v = qkv.split((hq * d, hk * d, hk * d), dim=-1)
    q, k, v = q.reshape(tokens, hq, d), k.reshape(tokens, hk, d), v.reshape(tokens, hk, d)
    positions = torch.randint(0, 70000, (tokens,), generator=gen).to(device)
    cos_sin = rope_cos_sin(positions, default_inv_freq(500000.0, d).to(device), dtype)
    pages, page_size = 20, 4
    caches = [torch.randn(pages, page_size, hk, d, generator=gen).to(device, dtype) for _ in "kv"]
    # NOTE: a column of a [tokens, steps] matrix, as a draft step's slots are (token stride 3)
    loc = torch.randperm(pages * page_size, generator=gen)[: tokens * 3].to(device).view(tokens, 3)[:, 1]
    return qkv, (q, k, v), cos_sin, caches, loc


@pytest.mark.parametrize("device", triton_devices())
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    ("tokens", "hq", "hk", "d"), [(1, 4, 2, 64), (7, 9, 3, 64), (16, 32, 8, 128), (3, 2, 2, 32)]
)
def test_kernel_matches_torch(monkeypatch, device, dtype, tokens, hq, hk, d) -> None:
    if device.type == "cpu":
        monkeypatch.setenv(rs.ENV, "interpret")
    qkv, (q, k, v), cos_sin, (kc, vc), loc = _inputs(device, dtype, tokens, hq, hk, d)
    assert rs.triton_enabled(rs.ENV, device) and rs.fits(q, k, v, cos_sin, kc)
    before, want_k, want_v = qkv.clone(), kc.clone(), vc.clone()
    rs.store_ref(want_k, loc, rs.rotate_ref(k, cos_sin))
    rs.store_ref(want_v, loc, v)
    got_q = rs.rope_store(q, k, v, cos_sin, kc, vc, loc)
    assert got_q.is_contiguous() and got_q.shape == (tokens, hq, d)
    torch.testing.assert_close(got_q, rs.rotate_ref(q, cos_sin), rtol=2**-7, atol=1e-3)
    torch.testing.assert_close(kc, want_k, rtol=2**-7, atol=1e-3)
    assert torch.equal(vc, want_v), "v is copied bit for bit"
    untouched = torch.ones(kc.shape[0] * kc.shape[1], dtype=torch.bool, device=device)
    untouched[loc] = False
    assert torch.equal(kc.view(-1, hk, d)[untouched], want_k.view(-1, hk, d)[untouched])
    assert torch.equal(qkv, before), "inputs are read, never written"


def test_torch_path_when_switched_off(monkeypatch) -> None:
    monkeypatch.setenv(rs.ENV, "0")
    _, (q, k, v), cos_sin, (kc, vc), loc = _inputs(torch.device("cpu"), torch.bfloat16, 5, 4, 2, 16)
    got_q = rs.rope_store(q, k, v, cos_sin, kc, vc, loc)
    assert torch.equal(got_q, rs.rotate_ref(q, cos_sin))
    assert torch.equal(kc.view(-1, 2, 16)[loc], rs.rotate_ref(k, cos_sin))
    assert torch.equal(vc.view(-1, 2, 16)[loc], v)


def test_rotation_is_rope() -> None:
    """Position 0 is the identity; a rotation keeps each pair's norm."""
    x = torch.randn(3, 2, 8)
    cos_sin = rope_cos_sin(torch.tensor([0, 5, 123]), default_inv_freq(10000.0, 8), torch.float32)
    out = rs.rotate_ref(x, cos_sin)
    torch.testing.assert_close(out[0], x[0])
    pair_norm = lambda t: t[..., :4] ** 2 + t[..., 4:] ** 2  # noqa: E731
    torch.testing.assert_close(pair_norm(out), pair_norm(x))


@rerun_marks
def test_kernel_under_triton_interpreter() -> None:
    """On a CPU box: this file again, with the kernel run by Triton's interpreter."""
    rerun_under_interpreter(__file__, passed=10)

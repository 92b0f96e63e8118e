"""Model ops: the fused sgl-kernel path against the torch definition (GPU), the torch path on CPU."""

from __future__ import annotations

import pytest
import torch

from graphrt.models import ops

needs_sgl = pytest.mark.skipif(
    not (torch.cuda.is_available() and ops._sgl() is not None), reason="needs CUDA + sgl_kernel"
)
# NOTE: both paths compute in float32 and round once; the fused kernels may order the sums
# differently, so outputs agree to a couple of bf16 ulps.
BF16_TOL = {"atol": 2e-2, "rtol": 2e-2}


def test_cpu_uses_the_torch_definitions() -> None:
    x = torch.randn(3, 8)
    assert ops.fused(x) is None
    w = torch.rand(8) + 0.5
    ref = x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt() * w
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-6), ref)
    normed, res = ops.add_rms_norm(x, torch.ones_like(x), w, 1e-6)
    torch.testing.assert_close(res, x + 1)
    torch.testing.assert_close(normed, ops.rms_norm_ref(x + 1, w, 1e-6))
    gate, up = torch.randn(3, 4), torch.randn(3, 4)
    torch.testing.assert_close(
        ops.silu_and_mul(torch.cat((gate, up), -1)), torch.nn.functional.silu(gate) * up
    )


def test_rope_matches_rotate_half() -> None:
    """NeoX RoPE: ``x * cos + rotate_half(x) * sin`` (transformers' ``apply_rotary_pos_emb``)."""
    t, h, d = 5, 3, 8
    q, k = torch.randn(t, h, d), torch.randn(t, 1, d)
    inv_freq = 10000.0 ** -(torch.arange(0, d, 2).float() / d)
    cos_sin = ops.rope_cos_sin(torch.arange(t) * 7, inv_freq, torch.float32)
    cos, sin = (torch.cat((c, c), -1)[:, None, :] for c in cos_sin.chunk(2, -1))

    def rotate_half(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, -1)
        return torch.cat((-x2, x1), -1)

    rq, rk = ops.apply_rope(q, k, cos_sin)
    torch.testing.assert_close(rq, q * cos + rotate_half(q) * sin)
    torch.testing.assert_close(rk, k * cos + rotate_half(k) * sin)


@needs_sgl
@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 7, 64])
def test_fused_ops_match_torch(tokens: int) -> None:
    dev, dt = torch.device("cuda"), torch.bfloat16
    hidden, inter, heads, kv_heads, d = 576, 1536, 9, 3, 64
    x = torch.randn(tokens, hidden, device=dev, dtype=dt)
    w = (torch.rand(hidden, device=dev) + 0.5).to(dt)
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-5), ops.rms_norm_ref(x, w, 1e-5), **BF16_TOL)

    residual = torch.randn_like(x)
    want_norm, want_res = ops.rms_norm_ref(residual + x, w, 1e-5), residual + x
    got_norm, got_res = ops.add_rms_norm(x.clone(), residual.clone(), w, 1e-5)
    torch.testing.assert_close(got_res, want_res, **BF16_TOL)
    torch.testing.assert_close(got_norm, want_norm, **BF16_TOL)

    gate_up = torch.randn(tokens, 2 * inter, device=dev, dtype=dt)
    torch.testing.assert_close(ops.silu_and_mul(gate_up), ops.silu_and_mul_ref(gate_up), **BF16_TOL)

    q = torch.randn(tokens, heads, d, device=dev, dtype=dt)
    k = torch.randn(tokens, kv_heads, d, device=dev, dtype=dt)
    inv_freq = 10000.0 ** -(torch.arange(0, d, 2, device=dev).float() / d)
    cos_sin = ops.rope_cos_sin(torch.arange(tokens, device=dev) + 4000, inv_freq, dt)
    want_q, want_k = ops.apply_rope_ref(q, cos_sin), ops.apply_rope_ref(k, cos_sin)
    got_q, got_k = ops.apply_rope(q.clone(), k.clone(), cos_sin)
    torch.testing.assert_close(got_q, want_q, **BF16_TOL)
    torch.testing.assert_close(got_k, want_k, **BF16_TOL)


@needs_sgl
@pytest.mark.gpu
def test_fused_ops_capture_in_a_graph() -> None:
    """The fused ops replay in a CUDA graph on new inputs written in place."""
    dev, dt = torch.device("cuda"), torch.bfloat16
    x = torch.randn(8, 256, device=dev, dtype=dt)
    res = torch.randn_like(x)
    w = torch.ones(256, device=dev, dtype=dt)
    for _ in range(2):  # NOTE: warm-up outside capture (kernel JIT / module load)
        ops.add_rms_norm(x.clone(), res.clone(), w, 1e-6)
    xs, rs = x.clone(), res.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, out_res = ops.add_rms_norm(xs, rs, w, 1e-6)
        y = ops.silu_and_mul(torch.cat((out, out_res), -1))
    new_x, new_res = torch.randn_like(x), torch.randn_like(x)
    xs.copy_(new_x)
    rs.copy_(new_res)
    graph.replay()
    want = ops.silu_and_mul_ref(torch.cat((ops.rms_norm_ref(new_x + new_res, w, 1e-6), new_x + new_res), -1))
    torch.testing.assert_close(y, want, **BF16_TOL)

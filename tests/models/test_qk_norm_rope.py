"""Qwen3's q/k RMSNorm + RoPE: the torch path's definition (CPU), when the fused sgl-kernel may run,
and (GPU) the fused kernel against the torch definition, eagerly and replayed in a CUDA graph.

GPU tolerance: atol = rtol = 2e-2 on unit-scale values (a couple of bf16 ulps: both compute in
float32 and round once, except that the torch path rounds the normed values and cos/sin to
bf16 before rotating, and the kernel computes its angles with ``__sincosf``).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

from graphrt.checkpoints.hf_config import parse_config
from graphrt.models import ops
from graphrt.models import qk_norm_rope as qkr
from graphrt.models.causal_lm import CausalLM

BF16_TOL = {"atol": 2e-2, "rtol": 2e-2}
#: Qwen3-8B's attention: 32 query heads, 8 KV heads, head_dim 128, rope_theta 1e6, eps 1e-6.
HQ, HK, D, THETA, EPS = 32, 8, 128, 1_000_000.0, 1e-6


def _sgl_kernel() -> Any:
    return ops._sgl()


needs_kernel = pytest.mark.skipif(
    not (torch.cuda.is_available() and _sgl_kernel() is not None), reason="needs CUDA + sgl_kernel"
)


def reference(
    qkv: torch.Tensor, heads: tuple[int, int], d: int, w: tuple, eps: float, pos: torch.Tensor, theta: float
):
    """The definition, float32 throughout: RMSNorm per head, then NeoX rotate-half RoPE."""
    hq, hk = heads
    q, k, v = qkv.float().split((hq * d, hk * d, hk * d), dim=-1)
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, device=qkv.device).float() / d)
    ang = pos.float()[:, None] * inv_freq[None]
    cos, sin = (torch.cat((f, f), -1)[:, None] for f in (ang.cos(), ang.sin()))

    def norm_rope(x: torch.Tensor, h: int, weight: torch.Tensor) -> torch.Tensor:
        x = x.view(-1, h, d)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
        x1, x2 = x.chunk(2, -1)
        return x * cos + torch.cat((-x2, x1), -1) * sin

    return norm_rope(q, hq, w[0]), norm_rope(k, hk, w[1]), v.view(-1, hk, d)


def _inputs(t: int, device: torch.device, dtype: torch.dtype, theta: float | None = THETA):
    gen = torch.Generator(device).manual_seed(0)
    qkv = (3 * torch.randn(t, (HQ + 2 * HK) * D, device=device, generator=gen)).to(dtype)
    w = tuple((1 + 0.3 * torch.randn(D, device=device, generator=gen)).to(dtype) for _ in "qk")
    pos = torch.randint(0, 32768, (t,), device=device, generator=gen)
    pos[:3] = torch.tensor([0, 1, 32767])[:t]  # NOTE: the edges, as many as there are tokens
    inv_freq = 1.0 / THETA ** (torch.arange(0, D, 2, device=device).float() / D)
    int_pos = pos.to(torch.int32) if device.type == "cuda" else pos
    rope = qkr.RopeInputs(ops.rope_cos_sin(pos, inv_freq, dtype), int_pos, theta)
    return qkv, w, pos, rope


def test_torch_path_is_per_head_rms_norm_then_rope() -> None:
    qkv, w, pos, rope = _inputs(9, torch.device("cpu"), torch.float32)
    before = qkv.clone()
    got = qkr.qk_norm_rope(qkv, (HQ, HK), D, w, EPS, rope)
    for g, want in zip(got, reference(qkv, (HQ, HK), D, w, EPS, pos, THETA), strict=True):
        torch.testing.assert_close(g, want, atol=1e-4, rtol=1e-4)
    assert torch.equal(qkv, before)  # the torch path leaves the projection alone


def _model_cfg(architecture: str = "Qwen3ForCausalLM", **rope: Any) -> Any:
    raw = {
        "architectures": [architecture], "vocab_size": 64, "hidden_size": 64, "intermediate_size": 64,
        "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64,
        "rope_theta": 5e5, **rope,
    }  # fmt: skip
    return parse_config(raw)


def test_fused_kernel_only_for_plain_rope_with_qk_norm() -> None:
    assert CausalLM(_model_cfg()).fused_rope_theta() == 5e5
    scaled = {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}
    assert CausalLM(_model_cfg(**scaled)).fused_rope_theta() is None  # the kernel cannot scale
    assert CausalLM(_model_cfg("LlamaForCausalLM")).fused_rope_theta() is None  # no q/k norm
    rope = CausalLM(_model_cfg()).rope_inputs(torch.arange(5), torch.float32)
    assert rope.positions.dtype == torch.int64  # int32 only for the CUDA kernel


def test_signature_check_names_the_difference() -> None:
    def right(qkv, num_heads_q, num_heads_k, num_heads_v, head_dim, eps, q_weight, k_weight, base,
              is_neox, position_ids, factor, low, high, attention_factor, rotary_dim=None): ...  # fmt: skip

    def wrong(qkv, num_heads_q, num_heads_k, num_heads_v, head_dim, eps, q_weight, k_weight,
              cos_sin_cache, is_neox, position_ids): ...  # fmt: skip

    assert qkr.signature_problem(right) is None
    problem = qkr.signature_problem(wrong)
    assert problem is not None and "cos_sin_cache" in problem and "base" in problem


@needs_kernel
@pytest.mark.gpu
def test_sgl_kernel_signature_is_the_one_called() -> None:
    kernel = getattr(_sgl_kernel(), "fused_qk_norm_rope", None)
    assert kernel is not None, "sgl_kernel has no fused_qk_norm_rope"
    problem = qkr.signature_problem(kernel)
    assert problem is None, f"sgl_kernel.fused_qk_norm_rope changed: {problem}"


@needs_kernel
@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 5, 64])
def test_fused_matches_torch_on_qwen3_attention(tokens: int) -> None:
    dev = torch.device("cuda")
    qkv, w, pos, rope = _inputs(tokens, dev, torch.bfloat16)
    want = reference(qkv, (HQ, HK), D, w, EPS, pos, THETA)
    torch_path = qkr.torch_qk_norm_rope(qkv, (HQ, HK), D, w, EPS, rope.cos_sin)
    fused_in = qkv.clone()
    got = qkr.qk_norm_rope(fused_in, (HQ, HK), D, w, EPS, rope)
    assert not torch.equal(fused_in, qkv), "the fused kernel did not run (it rewrites qkv in place)"
    for name, g, t, r in zip("qkv", got, torch_path, want, strict=True):
        # NOTE: both paths round to bf16 (an ulp at |x| in [2, 4) is 1.6e-2, and RoPE's
        # x1 cos - x2 sin cancels such errors into small outputs), so fused and torch are not
        # compared with each other: against the float32 reference the fused kernel must be as
        # accurate as the torch path it replaces, within one more rounding.
        err_fused, err_torch = ((x.float() - r).abs().max().item() for x in (g, t))
        assert err_fused <= 2 * err_torch + 1e-3, f"{name}: fused {err_fused:.3e} vs torch {err_torch:.3e}"


@needs_kernel
@pytest.mark.gpu
def test_fused_replays_in_a_cuda_graph_with_new_positions() -> None:
    dev = torch.device("cuda")
    qkv, w, pos, rope = _inputs(16, dev, torch.bfloat16)
    static = qkv.clone()
    qkr.qk_norm_rope(static.clone(), (HQ, HK), D, w, EPS, rope)  # NOTE: the self-check runs eagerly first
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = qkr.qk_norm_rope(static, (HQ, HK), D, w, EPS, rope)
    new_pos = (pos * 7 + 3) % 32768
    static.copy_(qkv)
    rope.positions.copy_(new_pos.to(torch.int32))
    graph.replay()
    for g, r in zip(out, reference(qkv, (HQ, HK), D, w, EPS, new_pos, THETA), strict=True):
        torch.testing.assert_close(g.float(), r, **BF16_TOL)


@needs_kernel
@pytest.mark.gpu
def test_a_kernel_that_disagrees_leaves_the_torch_path(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def does_nothing(qkv, num_heads_q, num_heads_k, num_heads_v, head_dim, eps, q_weight, k_weight, base,
                     is_neox, position_ids, factor, low, high, attention_factor, rotary_dim=None): ...  # fmt: skip

    monkeypatch.setattr(qkr, "_kernel", lambda qkv: does_nothing)
    monkeypatch.setattr(qkr, "_RESULTS", {})
    qkv, w, pos, rope = _inputs(4, torch.device("cuda"), torch.bfloat16)
    with caplog.at_level(logging.WARNING, logger="graphrt.models.qk_norm_rope"):
        got = qkr.qk_norm_rope(qkv, (HQ, HK), D, w, EPS, rope)
    assert "differs from the torch path" in caplog.text
    for g, r in zip(got, reference(qkv, (HQ, HK), D, w, EPS, pos, THETA), strict=True):
        torch.testing.assert_close(g.float(), r, **BF16_TOL)

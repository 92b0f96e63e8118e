"""Qwen3's per-head q/k RMSNorm + RoPE: sgl-kernel's ``fused_qk_norm_rope`` on GPU, torch elsewhere.

The torch path (CPU, other dtypes, and the oracle) is the model's original code: RMSNorm of each
q and k head (``ops.rms_norm``), then NeoX RoPE from the step's cos/sin table
(``ops.apply_rope``). The fused kernel does both in place on the ``qkv`` projection, computing
each angle itself as ``position * base ** (-2i / rotary_dim)``: it reproduces graphrt's
``inv_freq`` only for the default rope type (``base`` = ``rope_theta``, no frequency factors),
with its YaRN knobs neutral (``factor`` 1 leaves every frequency unscaled, whatever ``low`` and
``high`` are; ``attention_factor`` 1 leaves the magnitudes alone). So a model whose RoPE is
scaled never takes it.

It is used only when, for its device, head size and theta, it has first passed a one-time
check against the torch path (:func:`self_check`, run eagerly: never while a graph is being
captured; the runtime's warm-up runs come first). An sgl-kernel whose signature differs from
:data:`ARGS`, or whose results differ, leaves the torch path in place with one warning.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass

import torch

from graphrt.models import ops

log = logging.getLogger(__name__)

#: ``sgl_kernel.fused_qk_norm_rope``'s parameters, in order (sgl-kernel 0.4.5).
ARGS = (
    "qkv", "num_heads_q", "num_heads_k", "num_heads_v", "head_dim", "eps", "q_weight", "k_weight",
    "base", "is_neox", "position_ids", "factor", "low", "high", "attention_factor", "rotary_dim",
)  # fmt: skip
#: Head sizes the kernel is compiled for (one warp per head, ``head_dim / 32`` values a lane).
HEAD_DIMS = (64, 128, 256)
#: Largest |fused - torch| the self-check accepts on unit-scale values (a few bf16 ulps).
SELF_CHECK_ATOL = 3e-2


@dataclass(frozen=True, slots=True)
class RopeInputs:
    """What a Qwen-style attention layer needs for RoPE in one step.

    ``cos_sin [T, head_dim]`` (the torch path), ``positions [T]`` (int32 on CUDA, for the fused
    kernel) and ``theta``: ``rope_theta`` when the kernel's own angles equal ``cos_sin``'s,
    else None (the torch path only).
    """

    cos_sin: torch.Tensor
    positions: torch.Tensor
    theta: float | None


def signature_problem(fn: object) -> str | None:
    """Why ``fn`` is not the ``fused_qk_norm_rope`` this module calls, or None when it is."""
    try:
        names = tuple(inspect.signature(fn).parameters)  # type: ignore[arg-type]
    except (TypeError, ValueError) as err:
        return f"its signature cannot be read ({err})"
    if names != ARGS:
        return f"its parameters are ({', '.join(names)}), expected ({', '.join(ARGS)})"
    return None


def _kernel(qkv: torch.Tensor) -> object | None:
    sgl = ops.fused(qkv)
    return None if sgl is None else getattr(sgl, "fused_qk_norm_rope", None)


def torch_qk_norm_rope(
    qkv: torch.Tensor, heads: tuple[int, int], head_dim: int, weights: tuple[torch.Tensor, torch.Tensor],
    eps: float, cos_sin: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """The torch path: ``(q [T, Hq, D], k [T, Hk, D], v [T, Hk, D])``; ``qkv`` is not modified."""
    hq, hk = heads
    q, k, v = qkv.split((hq * head_dim, hk * head_dim, hk * head_dim), dim=-1)

    def norm(x: torch.Tensor, h: int, w: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, head_dim)  # NOTE: the fused RMSNorm takes 2-D rows
        return ops.rms_norm(flat, w, eps).view(-1, h, head_dim).contiguous()

    q, k = ops.apply_rope(norm(q, hq, weights[0]), norm(k, hk, weights[1]), cos_sin)
    return q, k, v.reshape(-1, hk, head_dim)


def _fused(
    kernel: object, qkv: torch.Tensor, heads: tuple[int, int], head_dim: int,
    weights: tuple[torch.Tensor, torch.Tensor], eps: float, positions: torch.Tensor, theta: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    hq, hk = heads
    # NOTE: factor 1.0 turns the kernel's YaRN scaling off (low/high are then unused);
    # attention_factor 1.0 leaves cos/sin unscaled; NeoX halves as graphrt's RoPE.
    kernel(qkv, hq, hk, hk, head_dim, eps, weights[0], weights[1], theta, True, positions,  # type: ignore[operator]
           1.0, 0.0, 0.0, 1.0, head_dim)  # fmt: skip
    q, k, v = qkv.split((hq * head_dim, hk * head_dim, hk * head_dim), dim=-1)
    return q.view(-1, hq, head_dim), k.view(-1, hk, head_dim), v.view(-1, hk, head_dim)


def qk_norm_rope(
    qkv: torch.Tensor, heads: tuple[int, int], head_dim: int, weights: tuple[torch.Tensor, torch.Tensor],
    eps: float, rope: RopeInputs,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """Per-head RMSNorm of q and k (``weights`` ``[head_dim]`` each), then NeoX RoPE; v as is.

    ``qkv [T, (Hq + 2 Hk) * D]`` (``heads = (Hq, Hk)``). Returns ``(q, k, v)`` ``[T, H, D]``;
    the fused path rewrites ``qkv`` in place and returns views of it.
    """
    kernel = _kernel(qkv)
    usable = (
        kernel is not None
        and rope.theta is not None
        and qkv.dtype == torch.bfloat16
        and head_dim in HEAD_DIMS
        and qkv.is_contiguous()
        and rope.positions.dtype == torch.int32
        and all(w.dtype == torch.bfloat16 and w.is_contiguous() for w in weights)
    )
    if usable and _checked(qkv.device, head_dim, rope.theta, eps):
        return _fused(kernel, qkv, heads, head_dim, weights, eps, rope.positions, rope.theta)  # type: ignore[arg-type]
    return torch_qk_norm_rope(qkv, heads, head_dim, weights, eps, rope.cos_sin)


_RESULTS: dict[tuple[torch.device, int, float, float], bool] = {}


def _checked(device: torch.device, head_dim: int, theta: float, eps: float) -> bool:
    """Whether the kernel passed :func:`self_check` for this device, head size, theta and eps."""
    key = (device, head_dim, theta, eps)
    if key not in _RESULTS:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            # NOTE: no check inside a capture (it syncs): the graph records the torch path. The
            # runtime's eager warm-ups run before any capture, so this is only a fallback.
            return False
        problem = self_check(device, head_dim, theta, eps)
        if problem:
            log.warning("sgl_kernel.fused_qk_norm_rope not used (torch path instead): %s", problem)
        _RESULTS[key] = problem is None
    return _RESULTS[key]


def self_check(device: torch.device, head_dim: int, theta: float, eps: float) -> str | None:
    """Run the kernel once on a small random ``qkv`` (2 q heads, 1 kv head, positions up to
    8191) against the torch path; returns what is wrong, or None when they agree."""
    gen = torch.Generator(device).manual_seed(0)
    heads, t = (2, 1), 6
    qkv = torch.randn(t, 4 * head_dim, device=device, generator=gen).to(torch.bfloat16)
    kernel = _kernel(qkv)
    if kernel is None:
        return "sgl_kernel has no fused_qk_norm_rope"
    problem = signature_problem(kernel)
    if problem:
        return problem
    w = tuple(
        (1 + 0.2 * torch.randn(head_dim, device=device, generator=gen)).to(torch.bfloat16) for _ in "qk"
    )
    positions = torch.tensor([0, 1, 7, 300, 4099, 8191], device=device)
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim)
    cos_sin = ops.rope_cos_sin(positions, inv_freq, torch.bfloat16)
    want = torch_qk_norm_rope(qkv, heads, head_dim, w, eps, cos_sin)  # type: ignore[arg-type]
    try:
        got = _fused(kernel, qkv.clone(), heads, head_dim, w, eps, positions.int(), theta)  # type: ignore[arg-type]
    except (RuntimeError, TypeError) as err:
        return f"it failed: {err}"
    err = max((g.float() - x.float()).abs().max().item() for g, x in zip(got, want, strict=True))
    return None if err <= SELF_CHECK_ATOL else f"it differs from the torch path by {err:.3g}"

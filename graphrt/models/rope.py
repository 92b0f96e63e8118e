"""RoPE frequencies for loaded checkpoints: one function per capturable ``rope_type``.

Every supported type folds into ``inv_freq`` at load time, so the forward stays the same
pure tensor function of ``positions`` (capturable). ``dynamic`` and ``longrope`` rescale from
the longest position seen at run time (a host sync, different math per step): refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

#: Types whose frequencies depend on the batch (``max(positions)``): never capturable.
NOT_CAPTURABLE = ("dynamic", "longrope")


def default_inv_freq(theta: float, dim: int) -> torch.Tensor:
    """``theta ** (-2i / dim)`` for ``i < dim / 2``, float32, computed as transformers does."""
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _linear(inv_freq: torch.Tensor, params: Mapping[str, Any]) -> torch.Tensor:
    return inv_freq / float(params["factor"])


def _llama3(inv_freq: torch.Tensor, params: Mapping[str, Any]) -> torch.Tensor:
    """Llama 3.1 scaling: long wavelengths divided by ``factor``, short kept, smooth between."""
    factor, low, high = (float(params[k]) for k in ("factor", "low_freq_factor", "high_freq_factor"))
    old_len = float(params["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn_range(params: Mapping[str, Any], dim: int, theta: float) -> tuple[float, float]:
    """YaRN's correction range of rotary dims (transformers' ``find_correction_range``)."""
    old_len = float(params["original_max_position_embeddings"])

    def at(rotations: float) -> float:
        return (dim * math.log(old_len / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = at(float(params.get("beta_fast") or 32)), at(float(params.get("beta_slow") or 1))
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def _yarn(inv_freq: torch.Tensor, params: Mapping[str, Any]) -> torch.Tensor:
    """YaRN: frequencies interpolated by ``factor`` below the correction range, kept above it,
    a linear ramp between (transformers' ``_compute_yarn_parameters``); ``params`` carries
    ``rope_theta``. The attention factor scales cos/sin (:func:`rope_attention_factor`)."""
    dim, factor = 2 * inv_freq.numel(), float(params["factor"])
    low, high = _yarn_range(params, dim, float(params["rope_theta"]))
    high = high + 0.001 if low == high else high  # NOTE: as transformers, no zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp
    return inv_freq / factor * (1 - keep) + inv_freq * keep


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's ``0.1 * mscale * ln(factor) + 1`` (1 for ``factor <= 1``), transformers' ``yarn_get_mscale``."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def rope_attention_factor(rope_type: str, params: Mapping[str, Any]) -> float:
    """What cos/sin are multiplied by (transformers' ``_compute_yarn_parameters``): YaRN's
    ``attention_factor`` if given, else ``mscale(factor, mscale) / mscale(factor, mscale_all_dim)``
    when both are set (DeepSeek's form), else ``mscale(factor)``; 1 for other rope types."""
    if rope_type != "yarn":
        return 1.0
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])
    factor, mscale, all_dim = float(params["factor"]), params.get("mscale"), params.get("mscale_all_dim")
    if mscale and all_dim:
        return yarn_mscale(factor, float(mscale)) / yarn_mscale(factor, float(all_dim))
    return yarn_mscale(factor)


def mla_softmax_mscale(rope_type: str, params: Mapping[str, Any]) -> float:
    """What an MLA model's softmax scale is multiplied by: ``mscale(factor, mscale_all_dim) ** 2``
    for a scaled rope type with ``mscale_all_dim`` (transformers' ``yarn_apply_mscale``: DeepSeek
    scales every q.k dim, not only the rotary ones), else 1."""
    all_dim = params.get("mscale_all_dim")
    if rope_type == "default" or not all_dim:
        return 1.0
    return yarn_mscale(float(params["factor"]), float(all_dim)) ** 2


ROPE_TYPES: dict[str, Callable[[torch.Tensor, Mapping[str, Any]], torch.Tensor]] = {
    "default": lambda inv_freq, params: inv_freq,
    "linear": _linear,
    "llama3": _llama3,
    "yarn": _yarn,
}


def check_rope_type(rope_type: str) -> None:
    """Raise ``ValueError`` for a rope type graphrt cannot run inside a graph."""
    if rope_type in NOT_CAPTURABLE:
        raise ValueError(
            f"rope_type {rope_type!r} rescales frequencies from the longest position of each batch "
            f"(a host sync), so it cannot be captured; supported: {', '.join(ROPE_TYPES)}"
        )
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"rope_type {rope_type!r} is not supported; supported: {', '.join(ROPE_TYPES)}")


def rope_inv_freq(
    theta: float,
    dim: int,
    rope_type: str,
    params: Mapping[str, Any],
    freq_factors: torch.Tensor | None = None,
) -> torch.Tensor:
    """``inv_freq [dim / 2]`` float32 for ``rope_type``; ``freq_factors`` divide it (GGUF ``rope_freqs``)."""
    check_rope_type(rope_type)
    inv_freq = ROPE_TYPES[rope_type](default_inv_freq(theta, dim), params)
    return inv_freq if freq_factors is None else inv_freq / freq_factors.float().cpu()

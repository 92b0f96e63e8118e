"""The MLA KV cache: the 656-byte FP8 layout, its error bound, writes that touch only their slots."""

from __future__ import annotations

import pytest
import torch

from graphrt.kv.mla import FP8_BYTES, QK_DIM, MLAKVCache, MLAShape, dequantize_fp8, quantize_fp8


def test_fp8_layout_is_656_bytes_with_exact_rope() -> None:
    x = torch.randn(5, QK_DIM) * torch.logspace(-3, 3, 5)[:, None]
    rows = quantize_fp8(x)
    assert rows.shape == (5, FP8_BYTES) == (5, 656) and rows.dtype == torch.uint8
    scales = rows[:, 512:528].contiguous().view(torch.float32)
    assert torch.equal(scales, torch.exp2(torch.log2(scales).round()))  # powers of two
    rope = rows[:, 528:].contiguous().view(torch.bfloat16)
    assert torch.equal(rope, x[:, 512:].to(torch.bfloat16))


def test_fp8_round_trip_error_bound() -> None:
    """|x - deq(x)| <= max(|x| / 16, scale / 1024) on the 512 quantised values.

    e4m3 keeps 3 mantissa bits: round-to-nearest is within 2^-4 of |x| for normal values;
    below 2^-6 (subnormal, in scaled units) the step is 2^-9, i.e. error <= scale * 2^-10.
    """
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, QK_DIM, generator=gen) * torch.logspace(-4, 2, 64)[:, None]
    x[3, :128] = 0.0  # an all-zero tile
    x[4, 7] = 1e4  # one outlier in a tile
    back = dequantize_fp8(quantize_fp8(x))
    scale = quantize_fp8(x)[:, 512:528].contiguous().view(torch.float32).repeat_interleave(128, dim=1)
    err = (back[:, :512] - x[:, :512]).abs()
    bound = torch.maximum(x[:, :512].abs() / 16, scale / 1024)
    assert (err <= bound * (1 + 1e-6)).all()
    assert (err <= bound / 1.9).float().mean() > 0.5  # the bound is not vacuous
    torch.testing.assert_close(back[:, 512:], x[:, 512:].to(torch.bfloat16).float())


@pytest.mark.parametrize("layout", ["bf16", "fp8"])
def test_store_touches_only_its_slots(device: torch.device, layout: str) -> None:
    cache = MLAKVCache(MLAShape(2, 16, 5, 8, 64, 4), layout, torch.float32, device)
    assert cache.dummy_slot == 64 and cache.num_live_slots == 64
    assert cache.bytes_per_token == (656 if layout == "fp8" else 1152)
    before = [kv.clone() for kv in cache.kv]
    loc = torch.tensor([3, 40], device=device)
    x = torch.randn(2, QK_DIM, device=device)
    cache.store_latent(1, loc, x)
    assert torch.equal(cache.kv[0], before[0])
    changed = (cache.rows(1) != before[1].view(cache.rows(1).shape)).any(dim=-1).nonzero().flatten()
    assert changed.tolist() == [3, 40]
    tol = 0.07 if layout == "fp8" else 0.01
    torch.testing.assert_close(cache.gather(1, loc), x, rtol=tol, atol=tol)


def test_bad_layout_is_refused() -> None:
    with pytest.raises(ValueError, match="bf16"):
        MLAKVCache(MLAShape(1, 16, 3, 8, 64, 4), "int4", torch.float32, torch.device("cpu"))

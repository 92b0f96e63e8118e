"""The FP8 (e4m3) KV cache: quantisation, the cache and its bytes, stores (torch and the fused
RoPE + store kernel), scales from checkpoints, the stack and the snapshot."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from graphrt.debug.snapshot import load_snapshot, take_snapshot
from graphrt.engine.stack import build_stack
from graphrt.kv import KVShape, PagedKVCache
from graphrt.kv import rope_store as rs
from graphrt.kv.quant import FP8, FP8_MAX, KVScales, LayerScales, dequantize, quantize
from graphrt.models.ops import rope_cos_sin
from graphrt.models.rope import default_inv_freq
from graphrt.step.config import RuntimeConfig

SHAPE = KVShape(num_layers=3, num_kv_heads=2, head_dim=16, page_size=4, num_pages=9)


def test_quantize_rounds_to_nearest_and_saturates() -> None:
    x = torch.tensor([0.0, 1.0, 1.0625, 1.1875, 11.5, 13.0, 460.0, 1e6, -1e6, 0.001])
    got = quantize(x).float()
    # NOTE: ties go to the even mantissa (1.0625 -> 1, 1.1875 -> 1.25, 11.5 -> 12); past 448 it
    # saturates; 0.001 rounds to the smallest subnormal, 2^-9
    want = torch.tensor([0.0, 1.0, 1.0, 1.25, 12.0, 13.0, FP8_MAX, FP8_MAX, -FP8_MAX, 2.0**-9])
    assert torch.equal(got, want)
    scale = torch.tensor([0.5])
    assert torch.equal(dequantize(quantize(x[:6], scale), scale), want[:6])


def test_cache_bytes_scales_and_bad_scales() -> None:
    bf16, fp8 = (
        PagedKVCache(SHAPE, torch.bfloat16, torch.device("cpu")),
        PagedKVCache(SHAPE, FP8, torch.device("cpu")),
    )
    assert fp8.nbytes * 2 == bf16.nbytes == 2 * 3 * 2 * 16 * 2 * 9 * 4
    assert fp8.bytes_per_token == 2 * 3 * 2 * 16 and fp8.k[0].dtype == FP8
    assert bf16.scales(0) is None and torch.equal(fp8.scales(2).k, torch.ones(1))
    fp8.set_scales(KVScales.of([1, 2, 3], [4, 5, 6]))
    held = fp8.k_scale
    with pytest.raises(ValueError, match="layer 1: v_scale must be a finite number > 0, got nan"):
        fp8.set_scales(KVScales.of([1, 2, 3], [4, float("nan"), 6]))
    with pytest.raises(ValueError, match="2 layers of KV scales for a cache of 3 layers"):
        fp8.set_scales(KVScales.of([1, 2], [4, 5]))
    with pytest.raises(ValueError, match=r"apply to an FP8 cache, this one is torch\.bfloat16"):
        bf16.set_scales(KVScales.ones(3))
    assert fp8.k_scale is held and fp8.k_scale.tolist() == [1, 2, 3] and fp8.v_scale.tolist() == [4, 5, 6]
    assert fp8.scales(1).v.data_ptr() == fp8.v_scale.data_ptr() + 4, "a view: graphs read it in place"


def test_store_quantises_only_its_slots() -> None:
    kv = PagedKVCache(SHAPE, FP8, torch.device("cpu"), KVScales.of([0.5, 0.25, 2.0], [1.0, 4.0, 0.125]))
    gen = torch.Generator().manual_seed(0)
    k, v = (torch.randn(3, 2, 16, generator=gen) * 8 for _ in "kv")
    loc = torch.tensor([5, 0, 30])
    kv.store(1, loc, k, v)
    rows = kv.k[1].view(-1, 2, 16)
    assert torch.equal(rows[loc].view(torch.uint8), quantize(k / 0.25).view(torch.uint8))
    assert torch.equal(kv.v[1].view(-1, 2, 16)[loc].float(), quantize(v / 4.0).float())
    untouched = torch.ones(rows.shape[0], dtype=torch.bool)
    untouched[loc] = False
    assert not rows[untouched].float().any() and not kv.k[0].float().any()


def _rope_inputs(device: torch.device, tokens: int = 7, hq: int = 8, hk: int = 2, d: int = 64):
    gen = torch.Generator().manual_seed(tokens)
    qkv = (torch.randn(tokens, (hq + 2 * hk) * d, generator=gen) * 4).to(device, torch.bfloat16)
    q, k, v = (t.reshape(tokens, -1, d) for t in qkv.split((hq * d, hk * d, hk * d), dim=-1))
    cos_sin = rope_cos_sin(
        torch.randint(0, 4000, (tokens,), generator=gen).to(device),
        default_inv_freq(1e4, d).to(device),
        torch.bfloat16,
    )
    caches = [torch.zeros(6, 4, hk, d, dtype=FP8, device=device) for _ in "kv"]
    loc = torch.randperm(24, generator=gen)[:tokens].to(device)
    scales = LayerScales(torch.tensor([0.02], device=device), torch.tensor([0.05], device=device))
    return (q, k, v), cos_sin, caches, loc, scales


def test_rope_store_quantises_on_the_torch_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(rs.ENV, "0")
    (q, k, v), cos_sin, (kc, vc), loc, scales = _rope_inputs(torch.device("cpu"))
    out = rs.rope_store(q, k, v, cos_sin, kc, vc, loc, scales)
    assert out.dtype == torch.bfloat16 and torch.equal(out, rs.rotate_ref(q, cos_sin))
    want_k = quantize(rs.rotate_ref(k, cos_sin), scales.k)
    assert torch.equal(kc.view(-1, 2, 64)[loc].view(torch.uint8), want_k.view(torch.uint8))
    assert torch.equal(vc.view(-1, 2, 64)[loc].view(torch.uint8), quantize(v, scales.v).view(torch.uint8))
    with pytest.raises(ValueError, match="written with its layer's scales; none were given"):
        rs.rope_store(q, k, v, cos_sin, kc, vc, loc)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
def test_rope_store_kernel_quantises_like_torch() -> None:
    """The Triton kernel writes the same FP8 bytes as the torch path (same rounding: model dtype,
    then a correctly rounded division, saturation, round to nearest even). CUDA only: Triton's
    interpreter does not round to FP8 like the hardware."""
    device = torch.device("cuda")
    (q, k, v), cos_sin, (kc, vc), loc, scales = _rope_inputs(device)
    want_k, want_v = kc.clone(), vc.clone()
    rs.store_ref(want_k, loc, rs.rotate_ref(k, cos_sin), scales.k)
    rs.store_ref(want_v, loc, v, scales.v)
    assert rs.triton_enabled(rs.ENV, device) and rs.fits(q, k, v, cos_sin, kc)
    out = rs.rope_store(q, k, v, cos_sin, kc, vc, loc, scales)
    torch.testing.assert_close(out, rs.rotate_ref(q, cos_sin), rtol=2**-7, atol=1e-3)
    assert torch.equal(kc.view(torch.uint8), want_k.view(torch.uint8))
    assert torch.equal(vc.view(torch.uint8), want_v.view(torch.uint8))


def test_stack_kv_cache_dtypes() -> None:
    config = RuntimeConfig(max_batch_size=2, max_context_len=32, page_size=16, capture_modes=())
    cpu = torch.device("cpu")
    fp8 = build_stack("tiny-llama", cpu, config, kv_cache_dtype="fp8_e4m3")
    auto = build_stack("tiny-llama", cpu, config, kv_cache_dtype="auto")
    assert fp8.kv.dtype == FP8 and auto.kv.dtype == torch.float32
    assert fp8.kv.nbytes * 4 == auto.kv.nbytes and fp8.kv.k_scale.tolist() == [1.0] * 4
    assert fp8.runtime.backend.name == "reference"
    for bad in ("fp8", "bf16", "int8"):
        with pytest.raises(ValueError, match=rf"kv_cache_dtype '{bad}' is not one of auto, fp8_e4m3"):
            build_stack("tiny-llama", cpu, config, kv_cache_dtype=bad)


def test_snapshot_and_inspect_show_the_fp8_cache(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from graphrt.cli import main

    config = RuntimeConfig(max_batch_size=2, max_context_len=32, page_size=16)
    stack = build_stack("tiny-llama", torch.device("cpu"), config, kv_cache_dtype="fp8_e4m3")
    stack.kv.set_scales(KVScales.of([0.5, 1, 1, 2], [1, 1, 1, 0.25]))
    take_snapshot(stack.runtime, tmp_path / "snap.json")
    kv = load_snapshot(tmp_path / "snap.json").kv
    assert kv is not None and kv.dtype == "float8_e4m3fn" and kv.nbytes == stack.kv.nbytes
    assert kv.bytes_per_token == 2 * 4 * 2 * 64 == 1024 and kv.k_scale == (0.5, 1, 1, 2)
    assert main(["inspect", str(tmp_path / "snap.json"), "--no-kernels", "--width", "200"]) == 0
    out = capsys.readouterr().out
    assert "float8_e4m3fn" in out and "1024 B/token" in out and "k_scale 0.5..2, v_scale 0.25..1" in out


def test_engine_fp8_graphed_equals_eager_and_a_tree_draft_keeps_fp8() -> None:
    """Engine-level: graphed tokens equal eager ones over an FP8 cache (sinks too); a tree draft
    takes the target's FP8 cache, moves accepted KV bytes and still yields plain greedy tokens."""
    from graphrt import Engine

    kw = dict(kv_cache_dtype="fp8_e4m3", max_batch_size=2, max_context_len=64, device="cpu")
    prompts = [[1, 2, 3], [7, 8, 9, 10, 11]]
    graphed = Engine("tiny-sinks", **kw).generate(prompts, max_new_tokens=10)
    assert graphed == Engine("tiny-sinks", use_graphs=False, **kw).generate(prompts, max_new_tokens=10)
    plain = Engine("tiny-llama", **kw).generate(prompts, max_new_tokens=10)
    spec = {"draft_model": "tiny-llama-draft", "num_steps": 2, "topk": 2, "draft_init": "seed"}
    engine = Engine("tiny-llama", speculative=spec, **kw)
    assert engine.kv.dtype == FP8 and engine.spec is not None and engine.spec.draft.kv.dtype == FP8
    assert engine.generate(prompts, max_new_tokens=10) == plain

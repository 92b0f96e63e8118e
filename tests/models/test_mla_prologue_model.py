"""Dense MLA's fused prologue inside the model (:mod:`graphrt.kv.latent_store`): eager EXTEND and
DECODE steps of ``tiny-mla`` with ``GRAPHRT_FUSED_ROPE_STORE`` on against the same steps with it
off (the torch ops: the model's RoPE, RMSNorm and ``LatentKVCache.store``).

Both RoPE layouts, three heads, an EXTEND of 13 tokens over two rows. On the CPU the kernel runs
through Triton's interpreter in fp16, where its float32 math is numpy's as torch's is: logits and
both caches equal bit for bit. On the GPU (``-m gpu``, bf16) the torch path's norm is
sgl-kernel's, another rounding: logits agree to :data:`TOLERANCE`, caches to one bf16 rounding.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from graphrt import Batch, ForwardMode, RuntimeConfig
from graphrt.engine.stack import stack_for
from graphrt.kv import latent_store as ls
from graphrt.models import PRESETS, MLACausalLM
from tests.support.triton_util import triton_devices
from tests.support.util import Setup, perturb_norms, slot_of

#: Largest relative L2 / max difference of the GPU's fused and unfused bf16 logits (as
#: tests/models/test_prologue_model.py: one bf16 ulp here and there, carried by later layers).
TOLERANCE = 2**-5
LENS = (5, 8)


def build(device: torch.device, interleave: bool) -> Setup:
    """An eager-only ``tiny-mla`` runtime with three heads and perturbed norm weights."""
    cfg = replace(PRESETS["tiny-mla"], num_heads=3, rope_interleave=interleave)
    dtype = torch.float16 if device.type == "cpu" else torch.bfloat16
    model = MLACausalLM.from_seed(cfg, 0, device, dtype)
    perturb_norms(model)
    config = RuntimeConfig(
        max_batch_size=2,
        max_context_len=64,
        page_size=16,
        buckets=(2,),
        capture_modes=(),
        backend="reference",
    )
    stack = stack_for(model, config)
    return Setup(stack.runtime, stack.model, stack.kv, stack.req_to_token, config.max_pages)


def steps(setup: Setup) -> list[Batch]:
    """An EXTEND of both rows (``LENS`` tokens), then one DECODE step of each."""
    ids = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, setup.model.vocab_size, (sum(LENS) + 2,), generator=ids).tolist()
    extend = Batch.create(
        ForwardMode.EXTEND, input_ids=tokens[: sum(LENS)], seq_lens=list(LENS), req_pool_indices=[0, 1],
        out_cache_loc=[slot_of(setup, r, p) for r, n in enumerate(LENS) for p in range(n)], q_lens=list(LENS),
    )  # fmt: skip
    decode = Batch.create(
        ForwardMode.DECODE, input_ids=tokens[sum(LENS) :], seq_lens=[n + 1 for n in LENS],
        req_pool_indices=[0, 1], out_cache_loc=[slot_of(setup, r, n) for r, n in enumerate(LENS)],
    )  # fmt: skip
    return [extend, decode]


def run(setup: Setup, batch: Batch) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The step's logits and a copy of every layer's RoPE and latent cache after it."""
    logits = setup.runtime.run(batch, eager=True)
    return logits, [c.clone() for c in (*setup.kv.rope, *setup.kv.latent)]


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    got, want = got.float(), want.float()
    l2 = ((got - want).norm() / want.norm()).item()
    peak = ((got - want).abs().max() / want.abs().max()).item()
    assert max(l2, peak) <= TOLERANCE, f"fused vs torch logits: relative L2 {l2:.3g}, max {peak:.3g}"


@pytest.mark.parametrize("device", triton_devices())
@pytest.mark.parametrize("interleave", [True, False], ids=["interleaved", "neox"])
def test_fused_steps_match_torch(monkeypatch, device, interleave) -> None:
    setup = build(device, interleave)
    on = "interpret" if device.type == "cpu" else "1"
    launches = []
    fused = ls.rope_norm_store
    monkeypatch.setattr(ls, "rope_norm_store", lambda *a, **k: launches.append(1) or fused(*a, **k))
    for batch in steps(setup):
        monkeypatch.setenv(ls.ENV, "0")
        before = len(launches)
        want, want_caches = run(setup, batch)
        assert len(launches) == before, "switched off: the torch ops"
        monkeypatch.setenv(ls.ENV, on)
        got, got_caches = run(setup, batch)
        assert len(launches) - before == setup.model.cfg.num_layers, "one fused launch per layer"
        if device.type == "cpu":
            assert torch.equal(got, want), f"{batch.mode.name}: logits differ"
            assert all(torch.equal(a, b) for a, b in zip(got_caches, want_caches, strict=True))
        else:
            close(got, want)
            for a, b in zip(got_caches, want_caches, strict=True):
                torch.testing.assert_close(a, b, rtol=2**-7, atol=1e-3)


@pytest.mark.parametrize("grad", [False, True], ids=["no-grad", "grad"])
def test_absorb_and_expand_are_the_einsums(grad: bool) -> None:
    """``W_UK`` / ``W_UV`` as batched GEMMs on views (``expand`` writing through a transposed
    view, or autograd's copy) give the einsums' values, for 5 tokens and 3 heads (fp32: a GEMM
    writing a strided output may sum in another order on the CPU)."""
    attn = MLACausalLM.from_seed(
        replace(PRESETS["tiny-mla"], num_heads=3), 0, torch.device("cpu"), torch.float32
    )
    attn = attn.layers[0].attn
    cfg, gen = attn.cfg, torch.Generator().manual_seed(3)
    q = torch.randn(5, 3 * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim), generator=gen).view(5, 3, -1)
    out = torch.randn(5, 3, cfg.kv_lora_rank, generator=gen)
    w_uk, w_uv = attn.up_projections()
    with torch.set_grad_enabled(grad):
        qv, flat = attn.absorb(q), attn.expand(out)
        want_qv = torch.einsum("thn,hnc->thc", q[..., : cfg.qk_nope_head_dim], w_uk)
        want = torch.einsum("thc,hvc->thv", out, w_uv).reshape(5, -1)
    assert torch.equal(qv, want_qv), "the same bmm as the einsum's"
    assert flat.shape == (5, 3 * cfg.v_head_dim) and flat.is_contiguous()
    torch.testing.assert_close(flat, want, rtol=1e-5, atol=1e-4)

"""Dense MLA attention: the absorbed form (``qv`` against the latent cache) of every backend
against the unabsorbed math transformers computes, and which backends the kind offers.

The oracle expands each key's latent through ``kv_b_proj`` into per-head ``k_nope`` and
``v`` (``DeepseekV3Attention.expand_kv``), concatenates the shared RoPE key, and runs plain
softmax attention per head in float64. The backends see only the caches and
``qv = q_nope W_UK``; their ``[T, H, kv_lora_rank]`` output times ``W_UV`` must match it.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from graphrt.attention import AttendCall, available_backends, registry, select_backend
from graphrt.attention.fa3_mla import FA3MLABackend
from graphrt.buffers import Dims
from tests.support.paged_util import PagedCase, paged_case

HEADS, NOPE, ROPE, LATENT, V = 4, 32, 64, 512, 48
SCALE = (NOPE + ROPE) ** -0.5
CONTEXT = 96
CASES = [
    ([1, 17, 16, 96, 33], [1, 1, 1, 1, 1]),  # decode, page edges, full context
    ([9, 40, 96], [3, 3, 3]),  # a verify chain: 3 query tokens per request
    ([5, 40, 96], [5, 7, 30]),  # ragged extend with prefixes
]


def need(dtype: torch.dtype, rope: int = ROPE, latent: int = LATENT) -> dict[str, object]:
    return {"dtype": dtype, "rope_dim": rope, "kv_lora_rank": latent}


class LatentCase:
    """Random latent / RoPE caches on ``case``'s shuffled pages, queries and up-projections."""

    def __init__(self, case: PagedCase, device: torch.device) -> None:
        dtype = case.q.dtype
        gen = torch.Generator().manual_seed(5)
        pages, page_size = case.k_cache.shape[:2]
        tokens = case.q.shape[0]

        def rand(*shape: int, std: float = 1.0) -> torch.Tensor:
            return (torch.randn(*shape, generator=gen) * std).to(device, dtype)

        self.case = case
        self.rope, self.latent = rand(pages, page_size, 1, ROPE), rand(pages, page_size, 1, LATENT)
        self.q_nope, self.q_rope = rand(tokens, HEADS, NOPE), rand(tokens, HEADS, ROPE)
        self.w_uk = rand(HEADS, NOPE, LATENT, std=LATENT**-0.5)
        self.w_uv = rand(HEADS, V, LATENT, std=LATENT**-0.5)

    def absorbed(self, backend: object) -> torch.Tensor:
        """``backend``'s output ``[T, H, V]``: planned as the context plans, then ``W_UV``."""
        meta, group = self.case.meta, backend.buffers()  # type: ignore[attr-defined]
        if group is not None:
            dims = Dims(len(self.case.seq_lens), self.q_rope.shape[0], 0, 0)
            device = self.q_rope.device
            group = group.view_type(
                **{s.name: torch.zeros(s.size(dims), dtype=s.dtype, device=device) for s in group.specs}
            )
        qv = torch.einsum("thn,hnc->thc", self.q_nope, self.w_uk)
        call = AttendCall(self.q_rope, self.rope, self.latent, meta, SCALE, qv=qv, group=group)
        plan = backend.plan(call)  # type: ignore[attr-defined]
        out = backend.forward(dataclasses.replace(call, plan=plan))  # type: ignore[attr-defined]
        assert out.shape == (*self.q_rope.shape[:2], LATENT) and out.dtype == self.q_rope.dtype
        return torch.einsum("thc,hvc->thv", out.float(), self.w_uv.float())

    def unabsorbed(self) -> torch.Tensor:
        """transformers' way, float64: expand latents to per-head k_nope and v, attend causally."""
        rope, latent = self.rope.view(-1, ROPE).cpu().double(), self.latent.view(-1, LATENT).cpu().double()
        w_uk, w_uv = self.w_uk.cpu().double(), self.w_uv.cpu().double()
        q = torch.cat((self.q_nope, self.q_rope), dim=-1).cpu().double()
        outs, t = [], 0
        for slots, n, q_len in zip(self.case.slots, self.case.seq_lens, self.case.q_lens, strict=True):
            for p in range(n - q_len, n):
                keys = torch.as_tensor(slots[: p + 1])
                k_nope = torch.einsum("kc,hnc->khn", latent[keys], w_uk)
                k = torch.cat((k_nope, rope[keys][:, None].expand(-1, HEADS, -1)), dim=-1)
                v = torch.einsum("kc,hvc->khv", latent[keys], w_uv)
                probs = (torch.einsum("hd,khd->hk", q[t], k) * SCALE).softmax(-1)
                outs.append(torch.einsum("hk,khv->hv", probs, v))
                t += 1
        return torch.stack(outs)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize(("seq_lens", "q_lens"), CASES)
def test_absorbed_backends_match_unabsorbed_math(
    device: torch.device, page_size: int, seq_lens: list[int], q_lens: list[int]
) -> None:
    case = LatentCase(paged_case(device, page_size, CONTEXT, seq_lens, q_lens), device)
    expected = case.unabsorbed()
    atol = 3e-2 if device.type == "cuda" else 1e-5
    names = available_backends(device, "mla", **need(case.q_rope.dtype))
    assert names[-1] == "reference"
    for name in names:
        backend = select_backend(name, device, "mla", **need(case.q_rope.dtype))
        got = case.absorbed(backend).double().cpu()
        torch.testing.assert_close(got, expected, atol=atol, rtol=atol, msg=lambda m, n=name: f"{n}: {m}")


def test_fa3_is_offered_only_for_its_mla_shape() -> None:
    """FA3's qv kernel: bf16/fp16, RoPE 64 + latent 512, Hopper. Elsewhere the kind offers the
    reference, and asking for FA3 by name says where it is not available."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert available_backends(cpu, "mla", **need(torch.float32)) == ["reference"]
    assert not FA3MLABackend.available(cuda, **need(torch.float32))
    assert not FA3MLABackend.available(cuda, **need(torch.bfloat16, rope=32, latent=256))
    with pytest.raises(
        ValueError, match=r"MLA backend 'fa3' is not available on cpu with a float32 KV cache"
    ):
        select_backend("fa3", cpu, "mla", **need(torch.float32))
    known = ", ".join(registry.BACKENDS["mla"])
    with pytest.raises(ValueError, match=rf"unknown MLA backend 'flashmla'; known: {known}"):
        select_backend("flashmla", cpu, "mla", **need(torch.float32))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
def test_fa3_is_selected_for_deepseek_shapes_on_hopper() -> None:
    pytest.importorskip("sgl_kernel.flash_attn")
    cuda = torch.device("cuda")
    if torch.cuda.get_device_capability(cuda)[0] != 9:
        pytest.skip("FA3's qv path is Hopper-only")
    assert available_backends(cuda, "mla", **need(torch.bfloat16))[0] == "fa3"
    assert available_backends(cuda, "mla", **need(torch.bfloat16, rope=16, latent=32)) == ["reference"]

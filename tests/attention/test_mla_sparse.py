"""Sparse MLA: the torch reference against dense attention masked to the selected keys, and
the FlashMLA kernels (both KV layouts, heads padded to 64 and 128) against the reference."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from graphrt.attention import AttendCall, available_backends, select_backend
from graphrt.attention.flashmla import flashmla_available
from graphrt.attention.mla import SparseMLAReference
from graphrt.kv.mla import KV_LORA_RANK, QK_DIM, MLAKVCache
from graphrt.metadata.base import StepMetadata
from graphrt.metadata.sparse import SparseBuffers
from tests.support.mla_util import decode_meta, filled_cache, random_slots, sparse_for

SCALE = 128**-0.5


def dense_masked(q: torch.Tensor, kv: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Attention over EVERY slot with a mask that admits only the selected ones."""
    allowed = torch.zeros(q.shape[0], kv.shape[0], dtype=torch.bool, device=q.device)
    for t in range(q.shape[0]):
        chosen = slots[t][slots[t] >= 0].long()
        allowed[t, chosen] = True
    scores = torch.einsum("thd,sd->ths", q.float(), kv) * SCALE
    scores = scores.masked_fill(~allowed[:, None, :], float("-inf"))
    out = torch.einsum("ths,sd->thd", torch.nan_to_num(scores.softmax(-1)), kv[:, :KV_LORA_RANK])
    return out


def sparse_call(q: torch.Tensor, cache: MLAKVCache, sparse: SparseBuffers, meta: StepMetadata) -> AttendCall:
    """Layer 0 of ``cache`` attended over ``sparse``'s selected slots."""
    return AttendCall(q, cache.kv[0], cache.kv[0], meta, SCALE, group=sparse)


@pytest.mark.parametrize("layout", ["bf16", "fp8"])
def test_reference_matches_dense_masked(device: torch.device, layout: str) -> None:
    cache = filled_cache(layout, device)
    n = cache.num_live_slots
    # full rows, −1 tails, a one-key row and a row shorter than topk by far
    lens = [64, 40, 1, 7, 63, 64]
    slots = random_slots(len(lens), 64, n, lens, device)
    q = torch.randn(len(lens), 4, QK_DIM, device=device)
    ref = SparseMLAReference(4, layout, 64)
    out = ref.forward(sparse_call(q, cache, sparse_for(slots, 0, 1), decode_meta(1, 1, device)))
    kv = cache.gather(0, torch.arange(n, device=device))
    torch.testing.assert_close(out, dense_masked(q, kv, slots), rtol=1e-4, atol=1e-4)


def test_reference_all_invalid_row_is_zero_and_poison_free(device: torch.device) -> None:
    cache = filled_cache("bf16", device)
    cache.rows(0)[5] = float("nan")  # a never-selected slot holding NaN must not leak
    slots = random_slots(2, 64, 4, [0, 3], device)
    q = torch.randn(2, 4, QK_DIM, device=device)
    out = SparseMLAReference(4, "bf16", 64).forward(
        sparse_call(q, cache, sparse_for(slots, 0, 1), decode_meta(1, 1, device))
    )
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert out.isfinite().all()


def test_selection_errors_list_available() -> None:
    cpu = torch.device("cpu")
    assert available_backends(cpu, "sparse_mla", layout="fp8", num_heads=4) == ["reference"]
    with pytest.raises(ValueError, match="available: reference"):
        select_backend("flashmla", cpu, "sparse_mla", layout="fp8", num_heads=4)
    with pytest.raises(ValueError, match="unknown sparse-MLA backend"):
        select_backend("nope", cpu, "sparse_mla", layout="bf16", num_heads=4)


needs_flashmla = pytest.mark.skipif(
    not (torch.cuda.is_available() and flashmla_available(torch.device("cuda"), "bf16")),
    reason="needs CUDA + sgl_kernel.flash_mla",
)


@pytest.mark.gpu
@needs_flashmla
@pytest.mark.parametrize("layout", ["bf16", "fp8"])
@pytest.mark.parametrize("padded", [64, 128])
@pytest.mark.parametrize("api", ["static", "schedmeta"])
@pytest.mark.parametrize("q_len", [1, 3])
def test_flashmla_matches_reference(layout: str, padded: int, api: str, q_len: int) -> None:
    from graphrt.attention.flashmla import FlashMLABackend

    if api == "schedmeta" and layout == "bf16":
        pytest.skip("the BF16 path has no schedule")
    device = torch.device("cuda")
    cache = filled_cache(layout, device, num_pages=40, page_size=64)
    bs, topk = 3, 128
    lens = [topk, 100, 1, 64, 127, 5, topk, 30, 77][: bs * q_len]
    slots = random_slots(bs * q_len, topk, cache.num_live_slots, lens, device)
    q = torch.randn(bs * q_len, 4, QK_DIM, device=device, dtype=torch.bfloat16)
    meta = decode_meta(bs, q_len, device)
    kernel = FlashMLABackend(4, layout, topk, padded_heads=padded, api=api)
    sparse = sparse_for(slots, padded, bs)
    call = sparse_call(q, cache, sparse, meta)
    out = kernel.forward(dataclasses.replace(call, plan=kernel.plan(call)))
    ref = SparseMLAReference(4, layout, 64).forward(call)
    assert out.shape == (bs * q_len, 4, KV_LORA_RANK)
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)


def test_slot_width_rounded_with_minus_one_tail(device: torch.device) -> None:
    """A kernel that needs 128-wide index rows gets index_topk 64 padded with −1 columns."""
    from graphrt.kv import ReqToToken
    from graphrt.metadata.sparse import chain_candidates, fresh_sparse, select_topk, sparse_specs

    sparse = fresh_sparse(sparse_specs(64, 0, 128), 1, 2, device)
    assert sparse.topk_indices.shape == (2, 64) and sparse.topk_slots.shape == (2, 128)
    sparse.topk_slots.fill_(7)  # stale
    table = ReqToToken(2, 256, 16, 999, device)
    table.table[0] = torch.arange(256, device=device, dtype=torch.int32) + 1000
    scores = torch.randn(2, 256, device=device)
    kv_pos = torch.tensor([200, 10], device=device)
    rows = torch.tensor([0, 0], device=device)
    select_topk(scores, chain_candidates(table, rows, kv_pos), sparse)
    slots = sparse.topk_slots.cpu()
    assert (slots[:, 64:] == -1).all()
    assert (slots[0, :64] >= 1000).all() and (slots[0, :64] <= 1200).all()
    assert (slots[1, :11] >= 1000).all() and (slots[1, 11:] == -1).all()

"""The hook of the qkv epilogue (``GRAPHRT_QKV_ROPE``) in the context: :meth:`ForwardContext.kv_slot`
says where a layer's k and v go (or None), and ``attention(..., stored=slot)`` only attends.

CPU, no Triton needed: a bf16 tiny-llama on the reference backend; the context of a real step is
taken from its first ``attention`` call. Checked: which layers and steps get a slot, that a layer
attending with ``stored`` after its k/v were stored by hand equals the layer storing them itself
(``rope``: rotated as ``rope_store`` rotates), and the clear errors of a wrong or missing slot.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from graphrt.attention.context import ForwardContext
from graphrt.attention.kv_slot import KVSlot, slot_for
from graphrt.kv.quant import FP8
from graphrt.kv.rope_store import rotate_ref
from tests.models.test_prologue_model import build, step_batch

BF16 = torch.bfloat16


def step_context(setup, rows: int, monkeypatch: pytest.MonkeyPatch) -> ForwardContext:
    """The context of an eager DECODE step of ``rows`` rows (seq_len 34)."""
    seen: list[ForwardContext] = []
    attend = ForwardContext.attention

    def spy(self, *args, **kwargs):
        seen.append(self)
        return attend(self, *args, **kwargs)

    monkeypatch.setattr(ForwardContext, "attention", spy)
    setup.runtime.run(step_batch(setup, [3] * rows, 34), eager=True)
    monkeypatch.setattr(ForwardContext, "attention", attend)
    return seen[0]


def test_which_layers_and_steps_get_a_slot() -> None:
    """One token, 16-bit caches in the model's dtype, contiguous, the layer's own slots."""
    cache = torch.zeros(3, 16, 2, 64, dtype=BF16)
    kv = SimpleNamespace(
        k=[cache, cache.clone()], v=[cache.clone(), cache.clone()], window_layers=frozenset({1})
    )
    one, two = torch.tensor([5]), torch.tensor([5, 6])
    slot = slot_for(one, kv, 0, BF16, None)
    assert isinstance(slot, KVSlot) and slot.layer_id == 0 and slot.loc is one
    assert slot.k_cache is kv.k[0] and slot.v_cache is kv.v[0]
    assert slot_for(two, kv, 0, BF16, None) is None, "two tokens"
    assert slot_for(one[:0], kv, 0, BF16, None) is None, "no token (IDLE)"
    assert slot_for(one, kv, 1, BF16, None) is None, "a window-pool layer"
    assert slot_for(one, kv, 0, BF16, 32) is None, "a chunked-local layer"
    assert slot_for(one, kv, 0, torch.float16, None) is None, "a cache not in the model's dtype"
    for k in (cache.to(FP8), cache.float(), cache.transpose(1, 2)):
        odd = SimpleNamespace(k=[k], v=[k], window_layers=frozenset())
        assert slot_for(one, odd, 0, k.dtype, None) is None, f"{k.dtype} contiguous {k.is_contiguous()}"


def test_stored_attends_as_the_layer_storing_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    setup = build(torch.device("cpu"), "tiny-llama", buckets=(1, 2))
    ctx = step_context(setup, 1, monkeypatch)
    assert ctx.kv_slot(0, BF16) is not None and ctx.kv_slot(0, torch.float32) is None
    assert step_context(setup, 2, monkeypatch).kv_slot(0, BF16) is None, "two tokens: no slot"
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, 64, generator=gen).to(BF16) for h in (4, 2, 2))
    cos_sin = torch.randn(1, 64, generator=gen).to(BF16)
    kv = setup.kv
    before = [t.clone() for t in (kv.k[1], kv.v[1])]
    want = ctx.attention(1, q, k, v, rope=cos_sin)
    want_kv = [t.clone() for t in (kv.k[1], kv.v[1])]
    kv.k[1].copy_(before[0])
    kv.v[1].copy_(before[1])
    slot = ctx.kv_slot(1, BF16)
    kv.store(1, slot.loc, rotate_ref(k, cos_sin), v)  # NOTE: what the epilogue writes
    got = ctx.attention(1, rotate_ref(q, cos_sin), None, None, rope=cos_sin, stored=slot)
    assert torch.equal(got, want)
    assert torch.equal(kv.k[1], want_kv[0]) and torch.equal(kv.v[1], want_kv[1])
    with pytest.raises(ValueError, match="no k and v"):
        ctx.attention(1, q, None, None)
    with pytest.raises(ValueError, match="layer 0's slot of this step"):
        ctx.attention(1, q, None, None, stored=ctx.kv_slot(0, BF16))
    other = KVSlot(1, slot.k_cache, slot.v_cache, slot.loc.clone())
    with pytest.raises(ValueError, match="of another step"):
        ctx.attention(1, q, None, None, stored=other)
    assert torch.equal(kv.k[1], want_kv[0]) and torch.equal(kv.v[1], want_kv[1]), "a refused call wrote"

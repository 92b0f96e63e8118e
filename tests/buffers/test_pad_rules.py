"""Pad rules, dim symbols and spec/view consistency of StaticBuffers."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
import torch

from graphrt.buffers import BufferSpec, PadRule, StaticBuffers
from tests.buffers.toy_buffers import (
    DIMS,
    MAX_BS,
    MAX_CTX,
    MAX_PAGES,
    PAD_VALUES,
    SPECS,
    TPR,
    ToyView,
    fill_valid,
    make,
)


def test_pad_rules_pass_on_valid_padding() -> None:
    buffers = make(torch.device("cpu"))
    for bucket, bs in ((MAX_BS, 3), (4, 4), (4, 0), (1, 1)):
        fill_valid(buffers.view(bucket, TPR), bs, TPR)
        assert buffers.pad_violations(bucket, TPR, bs, PAD_VALUES) == [], (bucket, bs)


def test_pad_rules_detect_wrong_const() -> None:
    buffers = make(torch.device("cpu"))
    bucket, bs = MAX_BS, 3
    view = buffers.view(bucket, TPR)
    fill_valid(view, bs, TPR)
    view.seq_lens[bs] = 0  # first padded row: seq_len must be 1
    assert buffers.pad_violations(bucket, TPR, bs, PAD_VALUES) == ["seq_lens"]
    view.seq_lens[bs] = 1
    view.page_table[bucket - 1, 0] = 0  # slot 0 of a live page instead of the dummy page
    assert buffers.pad_violations(bucket, TPR, bs, PAD_VALUES) == ["page_table"]
    view.page_table[bucket - 1, 0] = PAD_VALUES["dummy_page"]
    view.out_loc[bs * TPR] = 0  # token rows start at bs * tokens_per_req
    assert buffers.pad_violations(bucket, TPR, bs, PAD_VALUES) == ["out_loc"]
    view.out_loc[bs * TPR] = PAD_VALUES["dummy_slot"]
    # the real rows are free to hold anything, the free rule and whole-buffer consts are checked
    view.out_loc[bs * TPR - 1] = 0
    view.logits.fill_(float("nan"))
    assert buffers.pad_violations(bucket, TPR, bs, PAD_VALUES) == []
    view.flags[1, 0] = 1  # dim 0 is not a batch axis: every row is padding
    assert buffers.pad_violations(bucket, TPR, bs, PAD_VALUES) == ["flags"]
    # the symbolic value comes from the mapping
    view.flags[1, 0] = 0
    assert buffers.pad_violations(bucket, TPR, bs, PAD_VALUES | {"dummy_page": 8}) == ["page_table"]


def test_pad_rules_detect_broken_step() -> None:
    buffers = make(torch.device("cpu"))
    bucket, bs = MAX_BS, 3
    view = buffers.view(bucket, TPR)
    fill_valid(view, bs, TPR)
    # real rows may rise by anything; padded entries bs+1.. must rise by pad_q_len each
    view.cu_seqlens[: bs + 1] = torch.tensor([0, 1, 5, 6], dtype=torch.int32)
    view.cu_seqlens[bs + 1 :] = 6 + TPR * torch.arange(1, bucket - bs + 1, dtype=torch.int32)
    assert buffers.pad_violations(bucket, TPR, bs, PAD_VALUES) == []
    view.cu_seqlens[-1] -= 1  # the last dummy request is one token short
    assert buffers.pad_violations(bucket, TPR, bs, PAD_VALUES) == ["cu_seqlens"]
    view.cu_seqlens[-1] += 1
    view.cu_seqlens[bs + 1 :] = 6  # flat: cumulative lengths stop rising
    assert buffers.pad_violations(bucket, TPR, bs, PAD_VALUES) == ["cu_seqlens"]
    view.cu_seqlens[bs + 1 :] = 6 + TPR * torch.arange(1, bucket - bs + 1, dtype=torch.int32)
    assert buffers.pad_violations(bucket, TPR, bs, PAD_VALUES | {"pad_q_len": 1}) == ["cu_seqlens"]


def test_pad_rule_int_step() -> None:
    @dataclass(slots=True)
    class One:
        cu: torch.Tensor

    spec = BufferSpec("cu", ("max_bs+1",), torch.int64, PadRule("step", 2))
    buffers = StaticBuffers("one", [spec], One, DIMS, torch.device("cpu"))
    view = buffers.view(4)
    view.cu.copy_(torch.tensor([0, 5, 7, 9, 11]))
    assert buffers.pad_violations(4, 1, 1, {}) == []
    assert buffers.pad_violations(4, 1, 0, {}) == ["cu"]  # 0 -> 5 is now a padded step


def test_view_type_must_match_specs() -> None:
    @dataclass(slots=True)
    class Missing:
        page_table: torch.Tensor
        seq_lens: torch.Tensor

    @dataclass(slots=True)
    class Extra(ToyView):
        extra: torch.Tensor

    cpu = torch.device("cpu")
    with pytest.raises(TypeError, match="Missing"):
        StaticBuffers("toy", SPECS, Missing, DIMS, cpu)
    with pytest.raises(TypeError, match="Extra"):
        StaticBuffers("toy", SPECS, Extra, DIMS, cpu)
    duplicated = (*SPECS, SPECS[0])
    with pytest.raises(TypeError):
        StaticBuffers("toy", duplicated, ToyView, DIMS, cpu)
    assert {f.name for f in dataclasses.fields(ToyView)} == {s.name for s in SPECS}


def test_dims_resolve() -> None:
    assert DIMS.resolve("max_bs") == MAX_BS
    assert DIMS.resolve("max_bs+1") == MAX_BS + 1
    assert DIMS.resolve("max_tokens+2") == MAX_BS * TPR + 2
    assert DIMS.resolve("max_pages") == MAX_PAGES
    assert DIMS.resolve("max_context_len") == MAX_CTX
    assert DIMS.resolve(7) == 7
    bucket = DIMS.for_bucket(3, 2)
    assert (bucket.max_bs, bucket.max_tokens, bucket.max_pages, bucket.max_context_len) == (3, 6, 4, 64)
    assert BufferSpec("x", ("max_bs+1", 2), torch.float16, PadRule("free")).nbytes(DIMS) == 9 * 2 * 2


def test_unknown_dim_symbol_raises() -> None:
    with pytest.raises(ValueError, match="max_batch"):
        DIMS.resolve("max_batch")

    @dataclass(slots=True)
    class One:
        x: torch.Tensor

    bad = BufferSpec("x", ("max_reqs", 4), torch.int32, PadRule("free"))
    with pytest.raises(ValueError, match="unknown dim symbol"):
        StaticBuffers("bad", [bad], One, DIMS, torch.device("cpu"))


def test_pad_rule_kinds() -> None:
    assert PadRule("const", 1).value == 1
    assert PadRule("step", "pad_q_len").kind == "step"
    assert PadRule("free").value == 0
    for kind in ("constant", "", "STEP", "zero"):
        with pytest.raises(ValueError, match="pad kind"):
            PadRule(kind)

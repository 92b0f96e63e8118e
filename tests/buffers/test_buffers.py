"""StaticBuffers: one arena per family, cached bucket views, exact memory report, poison, pad rules."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from graphrt.buffers import BufferSpec, Dims, PadRule, StaticBuffers
from graphrt.buffers.static import ALIGN

MAX_BS, TPR, MAX_PAGES, MAX_CTX = 8, 3, 4, 64
DIMS = Dims(max_bs=MAX_BS, max_tokens=MAX_BS * TPR, max_pages=MAX_PAGES, max_context_len=MAX_CTX)
PAD_VALUES = {"dummy_page": 7, "dummy_slot": 99, "pad_q_len": TPR}


@dataclass(slots=True)
class ToyView:
    page_table: torch.Tensor
    seq_lens: torch.Tensor
    scores: torch.Tensor
    cu_seqlens: torch.Tensor
    out_loc: torch.Tensor
    logits: torch.Tensor
    flags: torch.Tensor


# NOTE: device-derived specs are interleaved with host ones so the host-first layout is exercised.
SPECS = (
    BufferSpec("page_table", ("max_bs", "max_pages"), torch.int32, PadRule("const", "dummy_page")),
    BufferSpec("seq_lens", ("max_bs",), torch.int32, PadRule("const", 1), host=True),
    BufferSpec("scores", ("max_bs", 3), torch.float16, PadRule("const", 0)),
    BufferSpec("cu_seqlens", ("max_bs+1",), torch.int32, PadRule("step", "pad_q_len"), host=True),
    BufferSpec("out_loc", ("max_tokens",), torch.int64, PadRule("const", "dummy_slot"), host=True),
    BufferSpec("logits", ("max_tokens", 5), torch.float32, PadRule("free")),
    BufferSpec("flags", (2, "max_context_len"), torch.int64, PadRule("const", 0)),
)
HOST = ("seq_lens", "cu_seqlens", "out_loc")
ITEMSIZE = {torch.int32: 4, torch.int64: 8, torch.float16: 2, torch.float32: 4}


def expected_shape(name: str, bucket: int, tpr: int) -> tuple[int, ...]:
    """The bucket shape of each toy buffer, written out by hand."""
    return {
        "page_table": (bucket, MAX_PAGES),
        "seq_lens": (bucket,),
        "scores": (bucket, 3),
        "cu_seqlens": (bucket + 1,),
        "out_loc": (bucket * tpr,),
        "logits": (bucket * tpr, 5),
        "flags": (2, MAX_CTX),
    }[name]


def make(device: torch.device) -> StaticBuffers[ToyView]:
    return StaticBuffers("toy", SPECS, ToyView, DIMS, device)


def fill_valid(view: ToyView, bs: int, tpr: int) -> None:
    """Real rows 0..bs hold arbitrary data; padded rows follow every pad rule."""
    bucket = view.seq_lens.shape[0]
    view.page_table[:bs] = 3
    view.page_table[bs:] = PAD_VALUES["dummy_page"]
    view.seq_lens[:bs] = 17
    view.seq_lens[bs:] = 1
    view.scores.zero_()
    view.cu_seqlens.copy_(torch.arange(bucket + 1, dtype=torch.int32) * tpr)
    view.out_loc[: bs * tpr] = 5
    view.out_loc[bs * tpr :] = PAD_VALUES["dummy_slot"]
    view.logits.normal_()
    view.flags.zero_()


def test_views_are_slices_of_one_arena(device: torch.device) -> None:
    buffers = make(device)
    arena_ptr = buffers.arena.untyped_storage().data_ptr()
    for bucket in (1, 2, 5, MAX_BS):
        view = buffers.view(bucket, TPR)
        for spec in SPECS:
            t = getattr(view, spec.name)
            assert t.device.type == device.type
            assert t.dtype == spec.dtype
            assert t.untyped_storage().data_ptr() == arena_ptr
            # NOTE: a bucket view starts where the full buffer does (it only drops trailing rows).
            assert t.data_ptr() == buffers.full[spec.name].data_ptr()


@pytest.mark.parametrize("bucket", [1, 3, MAX_BS])
@pytest.mark.parametrize("tpr", [1, TPR])
def test_bucket_shapes(bucket: int, tpr: int) -> None:
    view = make(torch.device("cpu")).view(bucket, tpr)
    for spec in SPECS:
        assert tuple(getattr(view, spec.name).shape) == expected_shape(spec.name, bucket, tpr), spec.name


def test_full_shapes_are_the_max_dims() -> None:
    buffers = make(torch.device("cpu"))
    for spec in SPECS:
        assert tuple(buffers.full[spec.name].shape) == expected_shape(spec.name, MAX_BS, TPR)
    assert sorted(buffers.host_full) == sorted(HOST)
    assert buffers.host("seq_lens").shape == (MAX_BS,)
    assert buffers.host("seq_lens").dtype == np.int32


def test_view_beyond_allocation_raises() -> None:
    buffers = make(torch.device("cpu"))
    with pytest.raises(ValueError, match="exceeds"):
        buffers.view(MAX_BS + 1, 1)
    with pytest.raises(ValueError, match="exceeds"):
        buffers.view(MAX_BS, TPR + 1)
    with pytest.raises(ValueError, match="exceeds"):
        buffers.view(0, 1)


def test_views_cached_and_addresses_stable_across_uploads(device: torch.device) -> None:
    buffers = make(device)
    view = buffers.view(4, TPR)
    assert buffers.view(4, TPR) is view
    assert buffers.view(4, 1) is not view  # another token count is another view
    ptrs = {spec.name: getattr(view, spec.name).data_ptr() for spec in SPECS}
    for step in range(20):
        buffers.wait_host_free()
        buffers.host("seq_lens")[:] = np.arange(MAX_BS) + step
        buffers.host("cu_seqlens")[:] = np.arange(MAX_BS + 1) * step
        buffers.host("out_loc")[:] = step
        buffers.upload()
        again = buffers.view(4, TPR)
        assert again is view
        assert {spec.name: getattr(again, spec.name).data_ptr() for spec in SPECS} == ptrs
    # the last upload is what the device views hold
    assert view.seq_lens.tolist() == [19, 20, 21, 22]
    assert view.cu_seqlens.tolist() == [0, 19, 38, 57, 76]
    assert view.out_loc.tolist() == [19] * (4 * TPR)


def test_upload_moves_only_host_buffers(device: torch.device) -> None:
    buffers = make(device)
    view = buffers.view(MAX_BS, TPR)
    view.page_table.fill_(42)
    view.logits.fill_(1.5)
    buffers.host("seq_lens")[:] = 9
    buffers.upload()
    assert (view.seq_lens == 9).all()
    assert (view.page_table == 42).all()
    assert (view.logits == 1.5).all()


def test_memory_report_is_exact() -> None:
    buffers = make(torch.device("cpu"))
    report = buffers.memory_report()
    sizes = {
        spec.name: int(np.prod(expected_shape(spec.name, MAX_BS, TPR))) * ITEMSIZE[spec.dtype]
        for spec in SPECS
    }
    assert sizes == {
        "page_table": 8 * 4 * 4,
        "seq_lens": 8 * 4,
        "scores": 8 * 3 * 2,
        "cu_seqlens": 9 * 4,
        "out_loc": 24 * 8,
        "logits": 24 * 5 * 4,
        "flags": 2 * 64 * 8,
    }
    assert report.family == "toy"
    assert report.total_bytes == sum(sizes.values()) == 1940
    assert {r.name: r.nbytes for r in report.rows} == sizes
    assert {r.name: r.shape for r in report.rows} == {
        s.name: expected_shape(s.name, MAX_BS, TPR) for s in SPECS
    }
    assert report.arena_bytes == buffers.arena.numel()
    assert report.padding_bytes == report.arena_bytes - report.total_bytes
    assert report.padding_bytes > 0  # every buffer here is shorter than ALIGN, so gaps exist

    # host buffers first, declaration order kept inside each group, each on an ALIGN boundary
    order = [r.name for r in report.rows]
    assert order == ["seq_lens", "cu_seqlens", "out_loc", "page_table", "scores", "logits", "flags"]
    assert [r.host for r in report.rows] == [True] * 3 + [False] * 4
    base = buffers.arena.data_ptr()
    offsets = {name: buffers.full[name].data_ptr() - base for name in order}
    expected, end = {}, 0
    for name in order:
        expected[name] = end
        end = -(-(end + sizes[name]) // ALIGN) * ALIGN
    assert offsets == expected
    assert report.arena_bytes == end
    host_end = -(-(expected["out_loc"] + sizes["out_loc"]) // ALIGN) * ALIGN
    assert report.host_arena_bytes == host_end == buffers.host_arena.numel()
    assert max(offsets[n] for n in HOST) < min(offsets[n] for n in order if n not in HOST)


def test_poison_lists_every_buffer_until_written(device: torch.device) -> None:
    buffers = make(device)
    bucket = 4
    view = buffers.view(bucket, TPR)
    buffers.poison()
    names = [spec.name for spec in buffers.specs]
    assert sorted(buffers.poisoned(bucket, TPR)) == sorted(names)
    assert (buffers.host("seq_lens") == -(2**31)).all()  # int32 poison: its minimum

    view.seq_lens.fill_(1)
    names.remove("seq_lens")
    assert sorted(buffers.poisoned(bucket, TPR)) == sorted(names)

    view.logits.zero_()  # float buffer: poisoned with NaN
    names.remove("logits")
    assert sorted(buffers.poisoned(bucket, TPR)) == sorted(names)

    # one stale element is enough to stay listed
    view.page_table.fill_(0)
    view.page_table[-1, -1] = -(2**31)
    assert "page_table" in buffers.poisoned(bucket, TPR)
    view.page_table[-1, -1] = 0
    names.remove("page_table")
    assert sorted(buffers.poisoned(bucket, TPR)) == sorted(names)

    # rows past the bucket are outside the view: writing only the bucket's rows clears it
    view.cu_seqlens.zero_()
    view.out_loc.zero_()
    view.scores.zero_()
    view.flags.zero_()
    assert buffers.poisoned(bucket, TPR) == []
    assert sorted(buffers.poisoned(MAX_BS, TPR)) == sorted(
        ["seq_lens", "logits", "page_table", "cu_seqlens", "out_loc", "scores"]
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

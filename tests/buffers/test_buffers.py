"""StaticBuffers: one arena per group, cached bucket views, exact memory report, poison."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrt.buffers.static import ALIGN
from tests.buffers.toy_buffers import (
    HOST,
    ITEMSIZE,
    MAX_BS,
    SPECS,
    TPR,
    expected_shape,
    make,
)


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
    assert report.group == "toy"
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

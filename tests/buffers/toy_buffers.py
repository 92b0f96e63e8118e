"""A toy buffer group shared by the buffer tests: every pad rule and dim symbol once."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from graphrt.buffers import BufferSpec, Dims, PadRule, StaticBuffers

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

"""The encoder buffer group: what cross-attention layers read each step (encoder-decoder models).

Per request row of the step: ``encoder_page_table [bs, encoder_pages]`` int32 (the pages of its
encoder K/V, then the encoder cache's dummy page) and ``encoder_lens [bs]`` int32 (its encoder
length). Derived on the device, inside the graph, by gathering each row of the
:class:`~graphrt.kv.EncoderKV` table at ``req_pool_indices`` (SGLang's ``encoder_page_table`` /
``encoder_lens_int32``). Pad rows name the dummy request, whose table row holds the dummy page
and length 1, so they satisfy the pad rules with no host work; every row is rewritten each
step, so nothing stale survives a batch that shrinks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from graphrt.buffers import BufferSpec, PadRule
from graphrt.kv.encoder import EncoderKV
from graphrt.metadata.base import StepBuffers
from graphrt.metadata.groups import GroupRow


def encoder_specs(encoder_pages: int) -> tuple[BufferSpec, ...]:
    """The group's buffers: one row per request, ``encoder_pages`` page-table columns."""
    return (
        BufferSpec(
            "encoder_page_table",
            ("max_bs", encoder_pages),
            torch.int32,
            PadRule("const", "encoder_dummy_page"),
        ),
        BufferSpec("encoder_lens", ("max_bs",), torch.int32, PadRule("const", 1)),
    )


@dataclass(slots=True)
class EncoderBuffers:
    """``encoder_page_table [bs, encoder_pages]`` int32 page ids of the encoder cache and
    ``encoder_lens [bs]`` int32 (FA3's ``page_table`` / ``cache_seqlens`` of a cross layer)."""

    encoder_page_table: torch.Tensor
    encoder_lens: torch.Tensor


@dataclass(frozen=True, slots=True)
class EncoderShape:
    """The group's geometry: page-table columns (the encoder cache's pages per row)."""

    max_pages: int


def derive_encoder(step: StepBuffers, out: EncoderBuffers, encoder: EncoderKV) -> None:
    """Gather every row of ``out`` from ``encoder``'s table at the step's ``req_pool_indices``.

    In place and sync-free: it runs inside the captured graph on the graph path.
    """
    rows = step.req_pool_indices
    torch.index_select(encoder.pages, 0, rows, out=out.encoder_page_table)
    torch.index_select(encoder.lens, 0, rows, out=out.encoder_lens)


#: Exists for an encoder-decoder model; every mode's program derives it on the device.
ENCODER_GROUP = GroupRow(
    "encoder",
    lambda g, dims: encoder_specs(g.encoder.max_pages),
    lambda g: EncoderBuffers,
    exists=lambda g: g.encoder is not None,
    used_by=lambda mode, g: True,
)

"""The static buffer groups of a runtime, from one table, and which modes write which.

:data:`GROUPS` lists every group's row (:class:`~graphrt.metadata.groups.GroupRow`): ``step``
serves every mode; ``cascade`` (expand lists and prefix lengths) exists for token trees;
``draft`` (every draft step's KV slots) serves DRAFT_DECODE; ``local`` holds the chunked-local
virtual batch; ``sampling`` (per-request sampling parameters) serves the modes that sample;
``attention`` is the attention backend's own group; ``encoder`` (encoder page table and
lengths) exists for encoder-decoder models; ``window`` the window-layer pool's slots and page
table; ``routing`` (MoE expert choices, their alignment) exists for models with MoE layers. The eager path builds the same groups at
the step's exact size, so both paths share every write and derive function.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from graphrt.buffers import Dims, MemoryReport, StaticBuffers
from graphrt.metadata.base import CascadeBuffers, StepBuffers
from graphrt.metadata.cascade import CASCADE_GROUP
from graphrt.metadata.draft import DRAFT_GROUP, DraftBuffers
from graphrt.metadata.encoder import ENCODER_GROUP, EncoderBuffers
from graphrt.metadata.groups import ATTENTION_GROUP, Geometry, GroupRow, Writer
from graphrt.metadata.local import LOCAL_GROUP, LocalBuffers
from graphrt.metadata.routing import ROUTING_GROUP, RoutingBuffers
from graphrt.metadata.sampling import SAMPLING_GROUP, SamplingBuffers
from graphrt.metadata.step import STEP_GROUP, draft_keys
from graphrt.metadata.window import WINDOW_GROUP, WindowBuffers
from graphrt.step.batch import Batch
from graphrt.step.modes import MODES, ForwardMode, rows_per_req

#: Every buffer group, in allocation and report order.
GROUPS: tuple[GroupRow, ...] = (
    STEP_GROUP,
    CASCADE_GROUP,
    DRAFT_GROUP,
    LOCAL_GROUP,
    SAMPLING_GROUP,
    ATTENTION_GROUP,
    ENCODER_GROUP,
    WINDOW_GROUP,
    ROUTING_GROUP,
)


@dataclass(frozen=True, slots=True)
class Dummies:
    """The reserved places pad rows use: never a live slot, page or request row
    (``encoder_page``: the encoder cache's dummy page, for encoder-decoder models)."""

    slot: int
    page: int
    req: int
    encoder_page: int | None = None


@dataclass(slots=True)
class StepInputs:
    """Everything one step's graph reads besides weights and the KV cache: a view of each
    group the mode uses (None for the others), by the groups' names."""

    step: StepBuffers
    cascade: CascadeBuffers | None = None
    draft: DraftBuffers | None = None
    local: LocalBuffers | None = None
    sampling: SamplingBuffers | None = None
    attention: Any = None  # the attention backend's own group (FA3: scheduler metadata)
    encoder: EncoderBuffers | None = None
    window: WindowBuffers | None = None
    routing: RoutingBuffers | None = None


@dataclass(frozen=True, slots=True)
class ModeGroups:
    """Per mode, worked out once: the groups it uses and which of them have a host writer."""

    used: tuple[StaticBuffers, ...]
    written: tuple[tuple[StaticBuffers, Writer], ...]


class BufferGroups:
    """The runtime's buffer groups, allocated once at ``dims`` (or exactly, for eager).

    Holds each group's writer and the pad values of each mode, and writes a step (host half,
    then one upload per written group).
    """

    def __init__(self, dims: Dims, device: torch.device, geometry: Geometry, dummies: Dummies) -> None:
        self.geometry, self.dummies = geometry, dummies
        rows = [row for row in GROUPS if row.exists(geometry)]
        self.rows = {row.name: row for row in rows}
        self.groups: dict[str, StaticBuffers] = {
            row.name: StaticBuffers(
                row.name, row.specs(geometry, dims), row.view_type(geometry), dims, device
            )
            for row in rows
        }
        self.writers: dict[str, Writer] = {}
        for row in rows:
            writer = row.writer(geometry, dims, device) if row.writer is not None else None
            if writer is not None:
                self.writers[row.name] = writer
        self._modes: dict[ForwardMode, ModeGroups] = {}
        self._pads: dict[ForwardMode, dict[str, int]] = {}

    @property
    def step(self) -> StaticBuffers:
        return self.groups["step"]

    def group(self, name: str) -> StaticBuffers | None:
        """The group ``name``, or None when this runtime's geometry has none."""
        return self.groups.get(name)

    def used_by(self, mode: ForwardMode) -> tuple[StaticBuffers, ...]:
        """The groups ``mode`` writes and reads (its update touches nothing else)."""
        return self._mode(mode).used

    def _mode(self, mode: ForwardMode) -> ModeGroups:
        found = self._modes.get(mode)
        if found is None:
            used = tuple(g for name, g in self.groups.items() if self.rows[name].used_by(mode, self.geometry))
            written = tuple((g, self.writers[g.group]) for g in used if g.group in self.writers)
            found = self._modes[mode] = ModeGroups(used, written)
        return found

    def pad_values(self, mode: ForwardMode) -> dict[str, int]:
        """Values padded rows of ``mode`` hold, by the names the pad rules use (rule 3 of
        docs/architecture.md).

        Pad requests of uniform modes carry the mode's query length; those of ragged modes
        one token, those of token-bucketed modes (MIXED) none: their bucket's token rows may
        all be real. Their ``seq_len`` covers their queries (at least the one key of the dummy
        request's position 0), so no position is negative.
        """
        pads = self._pads.get(mode)
        if pads is None:
            spec = MODES[mode]
            pad_q = 0 if spec.token_bucket else 1 if spec.ragged else rows_per_req(mode, self.geometry.spec)
            # NOTE: trees and drafts keep a one-token prefix in pad rows, so the prefix half of
            # a cascade never sees an empty sequence; a draft's step-0 token sits at position 1.
            cascade = self.groups.get("cascade")
            prefix = 1 if spec.draft_steps or (cascade is not None and cascade in self.used_by(mode)) else 0
            pads = self._pads[mode] = {
                "dummy_slot": self.dummies.slot,
                "dummy_page": self.dummies.page,
                "dummy_req": self.dummies.req,
                "pad_q_len": pad_q,
                "pad_seq_len": 1 + prefix if spec.draft_steps else max(pad_q, 1) + prefix,
                "pad_prefix_len": 1,
            }
            if self.dummies.encoder_page is not None:
                pads["encoder_dummy_page"] = self.dummies.encoder_page
            window = self.geometry.window
            if window is not None:
                pads |= {"window_dummy_slot": window.dummy_slot, "window_dummy_page": window.dummy_page}
        return pads

    def draft_keys(self, mode: ForwardMode) -> int:
        """Keys past ``cache_seqlens`` the page table covers: a draft chain's later steps."""
        return draft_keys(mode, self.geometry.spec)

    def exact(self, batch: Batch, rows: int) -> StepInputs:
        """The eager path: groups sized for exactly this step (``rows`` requests), written."""
        pad = self.pad_values(batch.mode)
        tokens = batch.num_tokens + (rows - batch.bs) * pad["pad_q_len"]
        exact = dataclasses.replace(self.step.dims, max_bs=rows, max_tokens=tokens)
        groups = BufferGroups(exact, self.step.device, self.geometry, self.dummies)
        groups.write(batch, rows, tokens)
        return groups.full(batch.mode)

    def view(
        self, mode: ForwardMode, bucket: int, rows_per_req: int, tokens: int | None = None
    ) -> StepInputs:
        """Bucket views of every group ``mode`` reads (cached: addresses never change);
        ``tokens``: the token rows when not ``bucket * rows_per_req`` (MIXED)."""
        return self._inputs(mode, lambda f: f.view(bucket, rows_per_req, tokens))

    def full(self, mode: ForwardMode) -> StepInputs:
        """Whole-allocation views (the eager path allocates groups at the exact size)."""
        return self._inputs(mode, lambda f: f.view_type(**f.full))

    def _inputs(self, mode: ForwardMode, view: Callable[[StaticBuffers], Any]) -> StepInputs:
        return StepInputs(**{f.group: view(f) for f in self.used_by(mode)})

    def write(
        self, batch: Batch, rows: int, tokens: int, pad: dict[str, int] | None = None, poison: bool = False
    ) -> None:
        """Host half of the update for every group the mode uses, then one copy each (none
        where the writer says the device already holds the step's values).

        Each group writes the next mirror of its ring, so this never waits for the copy of
        the step before (only for the one ``ring`` steps back). ``poison`` (debug mode)
        poisons the mode's groups first, so the update must rewrite every element.
        """
        pad = pad or self.pad_values(batch.mode)
        if poison:
            self.poison(batch.mode)
        for group, writer in self._mode(batch.mode).written:
            if writer.write(group, batch, rows, tokens, pad):
                group.upload()

    def poison(self, mode: ForwardMode) -> None:
        """Poison every group ``mode`` uses; their writers forget what the device held."""
        for group in self.used_by(mode):
            group.poison()
            writer = self.writers.get(group.group)
            if writer is not None:
                writer.forget()

    def poisoned(self, mode: ForwardMode, rows: int, rows_per_req: int, tokens: int) -> list[str]:
        """Buffers of ``mode``'s groups whose view of ``rows`` requests and ``tokens`` token rows
        still holds poison (debug mode; syncs)."""
        return [name for g in self.used_by(mode) for name in g.poisoned(rows, rows_per_req, tokens)]

    def forget(self) -> None:
        """The device buffers no longer match what the writers know (e.g. after a capture)."""
        for writer in self.writers.values():
            writer.forget()

    def memory_reports(self) -> tuple[MemoryReport, ...]:
        return tuple(g.memory_report() for g in self.groups.values())

"""The static buffer families of a runtime and which modes write which.

``step`` serves every mode; ``cascade`` (expand lists and prefix lengths) exists when the
speculative geometry has ``topk > 1`` and serves TARGET_VERIFY and DRAFT_DECODE; ``draft``
(every draft step's KV slots) serves DRAFT_DECODE; ``sampling`` (per-request sampling parameters)
exists with ``RuntimeConfig(sample=True)`` and serves the modes that sample (DECODE, EXTEND). The eager path builds the same families
at the step's exact size, so both paths share every write and derive function.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from graphrt.buffers import Dims, MemoryReport, StaticBuffers
from graphrt.metadata.base import CascadeBuffers, StepBuffers
from graphrt.metadata.cascade import cascade_specs, write_cascade_host
from graphrt.metadata.draft import DraftBuffers, draft_specs, write_draft_host
from graphrt.metadata.kernels import fused_update
from graphrt.metadata.local import LocalBuffers, LocalGeometry
from graphrt.metadata.sampling import SAMPLING_SPECS, SamplingBuffers, write_sampling
from graphrt.metadata.step import STEP_SPECS, PageBounds, write_host
from graphrt.step.batch import Batch
from graphrt.step.modes import MODES, ForwardMode, SpecGeometry, TreeInput, rows_per_req


@dataclass(frozen=True, slots=True)
class Dummies:
    """The reserved places pad rows use: never a live slot, page or request row."""

    slot: int
    page: int
    req: int


@dataclass(slots=True)
class StepInputs:
    """Everything one step's graph reads besides weights and the KV cache."""

    step: StepBuffers
    cascade: CascadeBuffers | None
    draft: DraftBuffers | None
    extra: Any = None  # the attention kind's family (sparse MLA: top-k indices, scheduler)
    local: LocalBuffers | None = None
    sampling: SamplingBuffers | None = None


class Families:
    """The runtime's buffer families, allocated once at ``dims`` (or exactly, for eager)."""

    def __init__(
        self,
        dims: Dims,
        device: torch.device,
        spec: SpecGeometry | None,
        kind: Any = None,
        local: LocalGeometry | None = None,
        sample: bool = False,
        page_size: int = 1,
    ) -> None:
        self.spec = spec
        self.step = StaticBuffers("step", STEP_SPECS, StepBuffers, dims, device)
        self.pages = PageBounds(dims.max_bs, dims.max_pages, page_size, fused_update(device))
        # NOTE: device-derived only (written inside the graph), so no host write or upload.
        self.extra: StaticBuffers | None = kind.static_buffers(dims, device) if kind is not None else None
        self.cascade = None
        self.draft = None
        if spec is not None and spec.topk > 1:
            width = max(spec.num_draft_tokens, spec.draft_forwards)
            self.cascade = StaticBuffers("cascade", cascade_specs(width), CascadeBuffers, dims, device)
        if spec is not None and spec.draft_forwards > 0:
            self.draft = StaticBuffers("draft", draft_specs(spec.draft_forwards), DraftBuffers, dims, device)
        # NOTE: chunked-local attention: derived on the device by every mode's program.
        self.local = None if local is None else local.family(dims, device)
        self.sampling = (
            StaticBuffers("sampling", SAMPLING_SPECS, SamplingBuffers, dims, device) if sample else None
        )
        #: Per mode: (families used, extra page-table keys, families with host buffers to copy).
        #: Functions of the mode and of which families exist, so worked out once, not per step.
        self._plans: dict[ForwardMode, tuple[tuple[StaticBuffers, ...], int, tuple[StaticBuffers, ...]]] = {}

    def used_by(self, mode: ForwardMode) -> list[StaticBuffers]:
        """The families ``mode`` writes and reads (its update touches nothing else)."""
        used = [self.step]
        if self.cascade is not None and MODES[mode].tree is not TreeInput.NONE:
            used.append(self.cascade)
        if self.draft is not None and MODES[mode].draft_steps:
            used.append(self.draft)
        if self.local is not None:
            used.append(self.local)
        if self.sampling is not None and MODES[mode].samples:
            used.append(self.sampling)
        return used

    def pad_values(self, mode: ForwardMode, dummies: Dummies) -> dict[str, int]:
        """Values padded rows of ``mode`` hold, by the names the pad rules use (DESIGN rule 3).

        Pad requests of uniform modes carry the mode's query length; those of ragged modes
        one token. Their ``seq_len`` covers their queries, so no position is negative.
        """
        spec = MODES[mode]
        pad_q = 1 if spec.ragged else rows_per_req(mode, self.spec)
        # NOTE: trees and drafts keep a one-token prefix in pad rows, so the prefix half of a
        # cascade never sees an empty sequence; a draft's step-0 token sits at position 1.
        prefix = 1 if spec.draft_steps or self.cascade in self.used_by(mode) else 0
        return {
            "dummy_slot": dummies.slot,
            "dummy_page": dummies.page,
            "dummy_req": dummies.req,
            "pad_q_len": pad_q,
            "pad_seq_len": 1 + prefix if spec.draft_steps else pad_q + prefix,
            "pad_prefix_len": 1,
        }

    @classmethod
    def exact(
        cls, batch: Batch, rows: int, pad: dict[str, int], dims: Dims, device: torch.device, **kw: Any
    ) -> StepInputs:
        """The eager path: families sized for exactly this step (``rows`` requests), written.

        ``dims`` gives ``max_pages`` / ``max_context_len``; ``kw`` are ``spec``, ``kind``, ``local``,
        ``page_size``.
        """
        tokens = batch.num_tokens + (rows - batch.bs) * pad["pad_q_len"]
        exact = dataclasses.replace(dims, max_bs=rows, max_tokens=tokens)
        families = cls(
            exact,
            device,
            kw.get("spec"),
            kw.get("kind"),
            kw.get("local"),
            kw.get("sample", False),
            kw.get("page_size", 1),
        )
        families.write(batch, rows, tokens, pad)
        return families.full(batch.mode)

    def view(self, mode: ForwardMode, bucket: int, rows_per_req: int) -> StepInputs:
        """Bucket views of every family ``mode`` reads (cached: addresses never change)."""
        return self._inputs(mode, lambda f: f.view(bucket, rows_per_req))

    def full(self, mode: ForwardMode) -> StepInputs:
        """Whole-allocation views (the eager path allocates families at the exact size)."""
        return self._inputs(mode, lambda f: f.view_type(**f.full))

    def _inputs(self, mode: ForwardMode, view: Callable[[StaticBuffers], Any]) -> StepInputs:
        views = {f.family: view(f) for f in self.used_by(mode)}
        extra = view(self.extra) if self.extra is not None else None
        return StepInputs(
            views["step"],
            views.get("cascade"),
            views.get("draft"),
            extra,
            views.get("local"),
            views.get("sampling"),
        )

    def extra_keys(self, mode: ForwardMode) -> int:
        """Keys past ``cache_seqlens`` the page table must cover: a draft chain's later steps."""
        if MODES[mode].draft_steps and self.spec is not None and self.cascade not in self.used_by(mode):
            return max(self.spec.draft_forwards - 1, 0)
        return 0

    def write(self, batch: Batch, rows: int, tokens: int, pad: dict[str, int]) -> None:
        """Host half of the update for every family the mode uses, then one copy each (none
        for the sampling family when it already holds this step's values: ``write_sampling``).

        Each family writes the next mirror of its ring, so this never waits for the copy of
        the step before (only for the one ``ring`` steps back).
        """
        used, extra, uploads = self._plan(batch.mode)
        step = self.step
        host = step.next_mirror()
        step.tags[step.slot] = write_host(batch, host, rows, tokens, pad, step.tags[step.slot])
        if step.state.setdefault("pages_known", False) is False:
            # NOTE: a fresh, poisoned or just-captured page table: rewrite every column once.
            self.pages.forget()
            step.state["pages_known"] = True
        self.pages.write(host["page_bound"], batch.seq_lens, rows, extra, pad["pad_seq_len"])
        if self.cascade in used:
            write_cascade_host(batch, self.cascade.next_mirror(), tokens, pad["dummy_slot"])
        if self.draft in used:
            write_draft_host(batch, self.draft.next_mirror(), tokens, pad["dummy_slot"])
        sampled = self.sampling in used and write_sampling(
            self.sampling, batch.sampling or (), batch.seq_lens, rows
        )
        for family in uploads:
            if family is not self.sampling or sampled:
                family.upload()

    def _plan(self, mode: ForwardMode) -> tuple[tuple[StaticBuffers, ...], int, tuple[StaticBuffers, ...]]:
        plan = self._plans.get(mode)
        if plan is None:
            used = tuple(self.used_by(mode))
            # NOTE: device-derived families have no host buffers, so nothing to copy.
            uploads = tuple(f for f in used if f.host_arena.numel())
            plan = self._plans[mode] = (used, self.extra_keys(mode), uploads)
        return plan

    def forget_pages(self) -> None:
        """The device page table no longer matches the host record (e.g. after a capture)."""
        self.step.state["pages_known"] = False

    def memory_reports(self) -> tuple[MemoryReport, ...]:
        families = (self.step, self.cascade, self.draft, self.local, self.sampling, self.extra)
        return tuple(f.memory_report() for f in families if f is not None)

"""Greedy speculative decoding with a draft model (chain, ``topk == 1``), graph per phase.

One round for the running requests: DRAFT_DECODE (the draft's remaining steps, one graph) →
TARGET_VERIFY (the pending token plus the drafts, one graph) → greedy acceptance on the host
→ DRAFT_EXTEND (the accepted tokens and the bonus token, ragged, one graph), whose last
logits give the next round's first draft token.

Invariant between rounds, for a request with ``m`` committed tokens: the target's KV holds
positions ``0 .. m-2`` (the last committed token is pending), the draft's KV holds
``0 .. m-1``, and ``draft_token`` is the draft's guess for position ``m``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from graphrt.runtime import GraphRuntime
from graphrt.step.batch import Batch
from graphrt.step.modes import ForwardMode, SpecGeometry


@dataclass(frozen=True, slots=True)
class SpecOptions:
    """``Engine(speculative={...})``, validated."""

    draft_model: str
    geometry: SpecGeometry
    draft_seed: int = 1
    draft_init: str = "target"  # "target": share the target's weights by name (early exit)

    @classmethod
    def parse(cls, options: dict[str, Any]) -> SpecOptions:
        known = {"draft_model", "num_steps", "topk", "num_draft_tokens", "draft_seed", "draft_init"}
        unknown = set(options) - known
        if unknown:
            raise ValueError(f"unknown speculative option(s) {sorted(unknown)}; known: {sorted(known)}")
        topk = int(options.get("topk", 1))
        if topk != 1:
            raise ValueError(f"the engine drives chain drafts only (topk 1), got topk {topk}")
        steps = int(options.get("num_steps", 3))
        geometry = SpecGeometry(steps, topk, int(options.get("num_draft_tokens", steps + 1)))
        return cls(
            str(options.get("draft_model", "tiny-llama-draft")), geometry, int(options.get("draft_seed", 1))
        )


@dataclass(slots=True)
class SpecState:
    """Per request: the draft's next guess."""

    draft_token: int = -1


@dataclass(slots=True)
class Acceptance:
    """Counts over verify steps: drafts proposed, drafts accepted, tokens committed."""

    verify_steps: int = 0
    proposed: int = 0
    accepted: int = 0
    per_position: list[int] = field(default_factory=list)  # accepted count at draft position i

    @property
    def rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def mean_accept_length(self) -> float:
        """Tokens committed per request per verify (accepted drafts + the bonus token)."""
        return (self.accepted / self.verify_steps + 1.0) if self.verify_steps else 0.0


def accept_greedy(drafts: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Accepted draft count per request: the longest prefix with ``drafts[:, i] == target[:, i]``.

    ``drafts [bs, k]``, ``target [bs, k + 1]`` (the target's argmax after each verify token).
    """
    match = drafts == target[:, :-1]
    return np.where(match.all(axis=1), drafts.shape[1], np.argmin(match, axis=1))


class SpecRunner:
    """Runs the draft and verify phases for a list of requests (see the module docstring)."""

    def __init__(
        self, target: GraphRuntime, draft: GraphRuntime, options: SpecOptions, page_size: int
    ) -> None:
        self.target, self.draft, self.options, self.page_size = target, draft, options, page_size
        self.geometry = options.geometry
        self.stats = Acceptance(per_position=[0] * options.geometry.num_steps)

    def start(self, reqs: Sequence[Any], eager: bool) -> None:
        """After the target's prefill: the draft reads prompt + first token, guesses the next."""
        if not reqs:
            return
        lens = [len(r.prompt) + len(r.output) for r in reqs]
        tokens = [[*r.prompt, *r.output] for r in reqs]
        batch = Batch.create(
            ForwardMode.EXTEND,
            input_ids=np.concatenate(tokens),
            seq_lens=lens,
            req_pool_indices=[r.req_idx for r in reqs],
            out_cache_loc=np.concatenate(
                [r.slots(0, n, self.page_size) for r, n in zip(reqs, lens, strict=True)]
            ),
            q_lens=lens,
        )
        logits = self.draft.run(batch, eager=eager)
        self._set_guesses(reqs, logits[np.cumsum(lens) - 1])

    def round(self, reqs: Sequence[Any], eager: bool) -> list[list[int]]:
        """One draft → verify → extend round; returns the tokens each request commits."""
        k = self.geometry.num_steps
        committed = np.array([len(r.prompt) + len(r.output) for r in reqs])
        drafts = self._draft(reqs, committed, eager)
        target = self._verify(reqs, committed, drafts, eager)
        accepted = accept_greedy(drafts, target)
        new = []
        for r, d, t, a in zip(reqs, drafts, target, accepted, strict=True):
            budget = r.max_new_tokens - len(r.output)
            new.append([*d[:a].tolist(), int(t[a])][:budget])
        self._count(accepted, k)
        live = [i for i, r in enumerate(reqs) if len(r.output) + len(new[i]) < r.max_new_tokens]
        if live:
            self._extend([reqs[i] for i in live], committed[live], [new[i] for i in live], eager)
        return new

    def _draft(self, reqs: Sequence[Any], committed: np.ndarray, eager: bool) -> np.ndarray:
        first = np.array([[r.spec.draft_token] for r in reqs])
        steps = self.geometry.draft_forwards
        if steps == 0:
            return first
        batch = Batch.create(
            ForwardMode.DRAFT_DECODE,
            input_ids=first[:, 0],
            seq_lens=committed + 1,
            req_pool_indices=[r.req_idx for r in reqs],
            out_cache_loc=np.concatenate(
                [r.slots(m, m + steps, self.page_size) for r, m in zip(reqs, committed, strict=True)]
            ),
            q_lens=np.ones(len(reqs), dtype=np.int64),
        )
        rest = self.draft.run(batch, eager=eager).cpu().numpy()
        return np.concatenate([first, rest], axis=1)

    def _verify(
        self, reqs: Sequence[Any], committed: np.ndarray, drafts: np.ndarray, eager: bool
    ) -> np.ndarray:
        n = self.geometry.num_draft_tokens
        pending = np.array([[r.output[-1]] for r in reqs])
        batch = Batch.create(
            ForwardMode.TARGET_VERIFY,
            input_ids=np.concatenate([pending, drafts], axis=1).reshape(-1),
            seq_lens=committed - 1 + n,
            req_pool_indices=[r.req_idx for r in reqs],
            out_cache_loc=np.concatenate(
                [r.slots(m - 1, m - 1 + n, self.page_size) for r, m in zip(reqs, committed, strict=True)]
            ),
            q_lens=np.full(len(reqs), n),
        )
        logits = self.target.run(batch, eager=eager)
        return logits.argmax(dim=-1).cpu().numpy().reshape(len(reqs), n)

    def _extend(
        self, reqs: Sequence[Any], committed: np.ndarray, new: Sequence[list[int]], eager: bool
    ) -> None:
        q = np.array([len(t) for t in new])
        batch = Batch.create(
            ForwardMode.DRAFT_EXTEND,
            input_ids=np.concatenate(new),
            seq_lens=committed + q,
            req_pool_indices=[r.req_idx for r in reqs],
            out_cache_loc=np.concatenate(
                [r.slots(m, m + n, self.page_size) for r, m, n in zip(reqs, committed, q, strict=True)]
            ),
            q_lens=q,
        )
        logits = self.draft.run(batch, eager=eager)
        self._set_guesses(reqs, logits[np.cumsum(q) - 1])

    def _set_guesses(self, reqs: Sequence[Any], logits: torch.Tensor) -> None:
        for r, t in zip(reqs, logits.argmax(dim=-1).tolist(), strict=True):
            r.spec.draft_token = int(t)

    def _count(self, accepted: np.ndarray, k: int) -> None:
        s = self.stats
        s.verify_steps += accepted.size
        s.proposed += accepted.size * k
        s.accepted += int(accepted.sum())
        for i in range(k):
            s.per_position[i] += int((accepted > i).sum())

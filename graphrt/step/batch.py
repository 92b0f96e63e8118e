"""The validated host inputs of one step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from graphrt.step.checks import fast_ok
from graphrt.step.fed import FED, PAD_DRAFT, fed_ids_error, fed_verify_ok
from graphrt.step.hostops import arange, umax, umin
from graphrt.step.limits import Limits
from graphrt.step.modes import MODES, ForwardMode, TreeInput, tokens_per_req
from graphrt.step.sampling import SamplingParams
from graphrt.step.values import INT64_MAX
from graphrt.step.values import distinct as _distinct
from graphrt.step.values import host_ints as _host_ints
from graphrt.step.values import in_range as _in_range
from graphrt.step.values import tree_mask as _tree_mask

#: One token per request, shared read-only by DECODE batches that omit ``q_lens``.
_ONES = np.ones(4096, dtype=np.int64)
_ONES.flags.writeable = False
__all__ = ["FED", "PAD_DRAFT", "Batch"]


@dataclass(frozen=True, slots=True)
class Batch:
    """Host inputs of one forward step (numpy int64 arrays).

    Parameters
    ----------
    mode : ForwardMode
    input_ids : [num_tokens]
        Token ids of this step's query tokens, request by request.
    seq_lens : [bs]
        KV length of each request *including* this step's tokens (DRAFT_DECODE: including the
        first draft step's token; every branch of a request sits at position ``seq_len - 1``).
    req_pool_indices : [bs]
        Row of each request in ``req_to_token``.
    out_cache_loc : [num_tokens] (DRAFT_DECODE: [num_tokens * draft steps])
        KV slot each new token is written to. DRAFT_DECODE lists, token by token, the slot of
        every draft step (token ``t`` of step ``i`` at position ``seq_len - 1 + i``).
    q_lens : [bs]
        Query tokens per request (1 for DECODE; the extend lengths for EXTEND; the accept
        lengths for DRAFT_EXTEND).
    tree_mask : [bs, q_len, q_len] bool, optional
        TARGET_VERIFY with ``topk > 1``: ``tree_mask[b, i, j]`` is true when draft token
        ``j`` is an ancestor of ``i`` or ``i`` itself. Token ``i`` sits at position
        ``seq_len - q_len + depth(i)``; its KV still goes to ``out_cache_loc[i]``.
    sampling : tuple of SamplingParams, optional
        One per request (modes with ``MODES[mode].samples``, runtime with ``sample=True``): the
        step then returns one sampled token id per request (``[bs]`` int64) instead of logits.
        Request ``i``'s token takes position ``seq_lens[i]``, the counter of its random draw.
        TARGET_VERIFY returns ``[bs, q_len]``: the token after each verify node (see
        ``graphrt.runtime.verify_sampler``).
    """

    mode: ForwardMode
    input_ids: np.ndarray
    seq_lens: np.ndarray
    req_pool_indices: np.ndarray
    out_cache_loc: np.ndarray
    q_lens: np.ndarray
    tree_mask: np.ndarray | None = None
    sampling: tuple[SamplingParams, ...] | None = None

    @classmethod
    def create(
        cls,
        mode: ForwardMode,
        *,
        input_ids: Any,
        seq_lens: Any,
        req_pool_indices: Any,
        out_cache_loc: Any,
        q_lens: Any = None,
        tree_mask: Any = None,
        sampling: Any = None,
    ) -> Batch:
        """Convert to host int64 arrays and check shapes; limits come in :meth:`check`.

        ``q_lens`` defaults to one token per request (DECODE); other modes pass it.
        """
        if not isinstance(mode, ForwardMode):
            raise TypeError(f"mode must be a ForwardMode, got {mode!r}")
        # NOTE: locals and a positional constructor, not a dict of fields: built every step.
        ids = _host_ints("input_ids", input_ids)
        seq = _host_ints("seq_lens", seq_lens)
        rows = _host_ints("req_pool_indices", req_pool_indices)
        locs = _host_ints("out_cache_loc", out_cache_loc)
        bs = seq.size
        implicit = q_lens is None
        if implicit:
            if not MODES[mode].implicit_q_len:
                raise ValueError(f"mode {mode.name} needs q_lens (query tokens per request)")
            q = _ONES[:bs] if bs <= _ONES.size else np.ones(bs, dtype=np.int64)
        else:
            q = _host_ints("q_lens", q_lens)
        mask = None if tree_mask is None else _tree_mask(tree_mask, q)
        params = None if sampling is None else tuple(sampling)
        batch = cls(mode, ids, seq, rows, locs, q, mask, params)
        batch._check_shapes(implicit)
        return batch

    @property
    def bs(self) -> int:
        """Real requests in the step (``len(seq_lens)``)."""
        return int(self.seq_lens.size)

    @property
    def num_tokens(self) -> int:
        """Query tokens in the step (``len(input_ids)``)."""
        return int(self.input_ids.size)

    @property
    def draft_steps(self) -> int:
        """KV writes per query token: 1, or the forward steps of a DRAFT_DECODE batch."""
        return self.out_cache_loc.size // self.num_tokens if self.num_tokens else 1

    @property
    def out_cache_loc_steps(self) -> np.ndarray:
        """``out_cache_loc`` as ``[num_tokens, draft_steps]``."""
        return self.out_cache_loc.reshape(self.num_tokens, self.draft_steps)

    @property
    def kv_positions(self) -> np.ndarray:
        """Position of each ``out_cache_loc`` entry: the last ``q_len`` positions of the request;
        for DRAFT_DECODE ``seq_len - 1 + step`` for every branch."""
        if MODES[self.mode].draft_steps:
            first = np.repeat(self.seq_lens - 1, self.q_lens)
            return (first[:, None] + np.arange(self.draft_steps)).reshape(-1)
        q = self.q_lens
        if q.size and umin(q) == umax(q):  # NOTE: uniform (a verify): three ops, not eight
            return ((self.seq_lens - int(q[0]))[:, None] + arange(int(q[0]))).reshape(-1)
        starts = np.repeat(self.seq_lens - self.q_lens, self.q_lens)
        offsets = np.arange(self.num_tokens) - np.repeat(np.cumsum(self.q_lens) - self.q_lens, self.q_lens)
        return starts + offsets

    @property
    def positions(self) -> np.ndarray:
        """RoPE position of every query token (``kv_positions``, or prefix + depth in a tree)."""
        if MODES[self.mode].draft_steps:
            return np.repeat(self.seq_lens - 1, self.q_lens)
        if self.tree_mask is None:
            return self.kv_positions
        depth = self.tree_mask.sum(axis=2).reshape(-1) - 1
        return np.repeat(self.seq_lens - self.q_lens, self.q_lens) + depth

    def _check_shapes(self, implicit_q: bool = False) -> None:
        bs, n = self.bs, self.num_tokens
        if implicit_q and self.req_pool_indices.size == bs and self.out_cache_loc.size == n == bs:
            if MODES[self.mode].idle and bs:
                raise ValueError(f"an IDLE step has no requests, got bs {bs}")
            self._check_sampling()
            return  # NOTE: one token per request by construction; the rest needs no reduction
        for name in ("req_pool_indices", "q_lens"):
            if getattr(self, name).size != bs:
                raise ValueError(f"Batch.{name} has {getattr(self, name).size} rows, seq_lens has {bs}")
        locs = self.out_cache_loc.size
        draft = MODES[self.mode].draft_steps and n and locs and locs % n == 0
        if locs != n and not draft:
            raise ValueError(f"Batch.out_cache_loc has {locs} entries, input_ids {n}")
        if int(self.q_lens.sum()) != n:
            raise ValueError(f"sum(q_lens) = {int(self.q_lens.sum())} but there are {n} input_ids")
        if bs and umin(self.q_lens) < 1:
            raise ValueError(f"every request needs >= 1 query token, got q_lens min {self.q_lens.min()}")
        if MODES[self.mode].idle and bs:
            raise ValueError(f"an IDLE step has no requests, got bs {bs}")
        self._check_sampling()

    def _check_sampling(self) -> None:
        if self.sampling is None:
            return
        if len(self.sampling) != self.bs:
            raise ValueError(f"Batch.sampling has {len(self.sampling)} entries, seq_lens has {self.bs}")
        if not all(isinstance(p, SamplingParams) for p in self.sampling):
            raise TypeError("Batch.sampling must hold SamplingParams")
        if not MODES[self.mode].samples:
            raise ValueError(
                f"{self.mode.name} does not sample: Batch.sampling is for DECODE, EXTEND and TARGET_VERIFY"
            )

    def check(self, limits: Limits, *, fed: bool = False) -> None:
        """Raise ``ValueError`` naming the value and the limit; writes nothing.

        ``fed``: a fed step (a gathering token feed): its ids follow
        :func:`graphrt.step.fed.fed_ids_error` (DECODE: every id :data:`FED`); otherwise every
        id must be a token id in ``[0, vocab_size)``.
        """
        bs = self.seq_lens.size
        if bs > limits.max_reqs:
            raise ValueError(f"batch too large: bs {bs} > max_reqs {limits.max_reqs}")
        if self.sampling is not None and not limits.sample:
            raise ValueError("Batch.sampling needs a runtime built with RuntimeConfig(sample=True)")
        if bs == 0:
            return
        ids = self.input_ids
        self._check_geometry(limits)
        if fed and not umin(ids) == FED == umax(ids):
            vocab = INT64_MAX if limits.vocab_size is None else limits.vocab_size
            verify = self.mode is ForwardMode.TARGET_VERIFY
            why = (
                None if verify and fed_verify_ok(ids, bs, vocab) else fed_ids_error(self.mode, ids, bs, vocab)
            )
            if why is not None:
                raise ValueError(why)
        if fast_ok(self, limits, limits.scratch, fed):
            return
        self._check_full(limits, fed)

    def _check_full(self, limits: Limits, fed: bool = False) -> None:
        """Every check after the geometry, one by one; raises the first that fails."""
        _in_range("req_pool_indices", self.req_pool_indices, 0, limits.max_reqs)
        _distinct("req_pool_indices", self.req_pool_indices, "row")
        end = int(self.kv_positions.max()) + 1
        if end > limits.max_context_len:
            raise ValueError(
                f"sequence past max context: seq_len {end} > max_context_len {limits.max_context_len}"
            )
        short = self.seq_lens < (1 if MODES[self.mode].draft_steps else self.q_lens)
        if short.any():
            i = int(np.argmax(short))
            raise ValueError(
                f"seq_len {int(self.seq_lens[i])} < q_len {int(self.q_lens[i])} in request {i} "
                "(seq_lens include the step's tokens)"
            )
        _distinct("out_cache_loc", self.out_cache_loc, "slot")
        vocab = INT64_MAX if limits.vocab_size is None else limits.vocab_size
        if not fed:  # NOTE: FED ids, checked by check(), come from the device
            _in_range("input_ids", self.input_ids, 0, vocab, what="token id")
        ps = limits.page_size
        pages, live = self.out_cache_loc // ps, limits.num_live_slots // ps
        outside = (pages < 0) | (pages >= live)
        if outside.any():
            i = int(np.argmax(outside))
            raise ValueError(
                f"page id out of range in out_cache_loc page: {int(pages[i])} not in [0, {live}) "
                f"(slot {int(self.out_cache_loc[i])} at out_cache_loc[{i}])"
            )
        positions = self.kv_positions
        off = self.out_cache_loc % ps != positions % ps
        if off.any():
            i = int(np.argmax(off))
            raise ValueError(
                f"out_cache_loc breaks page alignment: slot {int(self.out_cache_loc[i])} for position "
                f"{int(positions[i])} (slot % {ps} must equal position % {ps})"
            )

    def _check_geometry(self, limits: Limits) -> None:
        """Raise ``ValueError`` when the query lengths, tree mask or draft slots do not fit the mode."""
        rule = limits.scratch.geometry.get(self.mode)
        if rule is None:  # NOTE: a function of (mode, limits) only: worked out once per mode
            rule = limits.scratch.geometry[self.mode] = _Geometry.of(self.mode, limits)
        want = rule.want
        if want is None:
            return
        if rule.tree != (self.tree_mask is not None):
            need = "needs Batch.tree_mask (topk > 1)" if rule.tree else "takes no tree_mask (topk 1: a chain)"
            raise ValueError(f"{self.mode.name} {need}")
        if rule.draft and self.draft_steps != rule.steps:
            raise ValueError(
                f"{self.mode.name} writes {rule.steps} slot(s) per token, got {self.draft_steps}"
            )
        q = self.q_lens
        if rule.ragged:
            if umax(q) > want:
                raise ValueError(f"{self.mode.name}: q_len {int(q.max())} > num_draft_tokens {want}")
        elif not (want == 1 and q.base is _ONES) and not umin(q) == want == umax(q):
            # NOTE: q_lens that view the read-only _ONES (Batch.create's default) are all 1;
            # else min and max (two C reductions) beat ``q != want`` on a Python int.
            bad = int(q[q != want][0])
            raise ValueError(f"{self.mode.name} takes {want} token(s) per request, got q_len {bad}")


@dataclass(frozen=True, slots=True)
class _Geometry:
    """What the geometry check of one mode compares against (functions of the limits)."""

    want: int | None  # tokens per request; None: not a graphed mode, nothing to check
    tree: bool
    draft: bool
    steps: int
    ragged: bool

    @classmethod
    def of(cls, mode: ForwardMode, limits: Limits) -> _Geometry:
        spec = MODES[mode]
        want = tokens_per_req(mode, limits.speculative) if spec.graphed else None
        steps = limits.speculative.draft_forwards if limits.speculative else 0
        tree = limits.tree and spec.tree is TreeInput.MASK
        return cls(want, tree, bool(spec.draft_steps), steps, bool(spec.ragged))

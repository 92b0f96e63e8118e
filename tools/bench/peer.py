"""The SGLang-style peer of ``graphrt bench host``, and the bench's batches.

The peer runs the op sequence of seed 001's replay path (SGLang's FA3 backend,
``init_forward_metadata_replay_cuda_graph`` plus ``replay_prepare``'s input copies) as torch
ops on static buffers of the same shapes: the forward batch's H2D copies, the input copies
into the graph buffers, ``seq_lens_cpu.max().item()``, ``cumsum``, the strided page gather.
Deviation, stated: SGLang's ``topk > 1`` path copies token-level ``req_to_token`` rows (page
size 1 only); for page size > 1 the tree peer gathers with the page stride instead.
"""

from __future__ import annotations

import numpy as np
import torch

from graphrt import GraphRuntime
from graphrt.kv.ledger import KVWrites
from graphrt.metadata.cascade import chain_tree_mask
from graphrt.step import Batch, ForwardMode, SpecGeometry

M = ForwardMode
CHAIN = SpecGeometry(num_steps=3, topk=1)
TREE = SpecGeometry(num_steps=3, topk=2, num_draft_tokens=4)
#: bench case -> (mode, speculative geometry)
MODES: dict[str, tuple[ForwardMode, SpecGeometry | None]] = {
    "decode": (M.DECODE, None),
    "verify-chain": (M.TARGET_VERIFY, CHAIN),
    "verify-tree": (M.TARGET_VERIFY, TREE),
    "draft-decode": (M.DRAFT_DECODE, CHAIN),
    "draft-extend": (M.DRAFT_EXTEND, CHAIN),
}


def slots_of(rt: GraphRuntime, row: int, start: int, stop: int) -> np.ndarray:
    ps = rt.config.page_size
    per = (rt.kv.shape.num_pages - 1) // rt.req_to_token.max_reqs
    pos = np.arange(start, stop)
    return (row * per + pos // ps) * ps + pos % ps


def make_batch(case: str, rt: GraphRuntime, bs: int, real: int, rng: np.random.Generator) -> Batch:
    """A batch of ``bs`` requests holding ``real`` tokens each (their slots already recorded)."""
    mode, spec = MODES[case]
    for r in range(bs):
        rt.req_to_token.table[r, :real] = torch.as_tensor(slots_of(rt, r, 0, real), dtype=torch.int32)
    reqs = np.arange(bs, dtype=np.int64)
    # NOTE: the bench writes the request table itself (no prefill forward): the KV ledger is
    # told that these rows hold their first ``real`` positions, as a prefill would have left it.
    prefill = Batch.create(
        M.EXTEND,
        input_ids=np.zeros(bs * real, dtype=np.int64),
        seq_lens=np.full(bs, real),
        req_pool_indices=reqs,
        out_cache_loc=np.concatenate([slots_of(rt, r, 0, real) for r in reqs]),
        q_lens=np.full(bs, real),
    )
    rt.req_to_token.ledger.commit(KVWrites.of(prefill))
    n = spec.num_draft_tokens if spec else 1
    if mode is M.DECODE:
        q, loc = np.ones(bs, dtype=np.int64), np.concatenate([slots_of(rt, r, real, real + 1) for r in reqs])
    elif mode is M.TARGET_VERIFY:
        q, loc = np.full(bs, n), np.concatenate([slots_of(rt, r, real, real + n) for r in reqs])
    elif mode is M.DRAFT_DECODE:
        steps = spec.draft_forwards  # type: ignore[union-attr]
        q, loc = (
            np.ones(bs, dtype=np.int64),
            np.concatenate([slots_of(rt, r, real, real + steps) for r in reqs]),
        )
    else:
        q = rng.integers(1, n + 1, bs)
        loc = np.concatenate([slots_of(rt, r, real, real + a) for r, a in zip(reqs, q, strict=True)])
    seq = real + (1 if mode is M.DRAFT_DECODE else q)
    tree = None
    if spec is not None and spec.topk > 1 and mode is M.TARGET_VERIFY:
        tree = np.broadcast_to(chain_tree_mask(spec.num_steps, spec.topk, n), (bs, n, n)).copy()
    return Batch.create(
        mode,
        input_ids=rng.integers(0, 100, int(q.sum())),
        seq_lens=np.asarray(seq, dtype=np.int64) + np.zeros(bs, dtype=np.int64),
        req_pool_indices=reqs,
        out_cache_loc=loc.astype(np.int64),
        q_lens=q.astype(np.int64),
        tree_mask=tree,
    )


class Peer:
    """SGLang-style graph inputs and FA3 metadata buffers, and its replay prepare per mode."""

    def __init__(self, rt: GraphRuntime, spec: SpecGeometry | None) -> None:
        dev, cfg = rt.device, rt.config
        max_bs, tokens = rt.dispatcher.policy.largest, rt.groups.step.dims.max_tokens
        self.rt, self.spec, self.ps, self.dev = rt, spec, cfg.page_size, dev
        self.table = rt.req_to_token.table

        def z(*shape: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=dev)

        self.input_ids, self.positions, self.out_cache_loc = z(tokens), z(tokens), z(tokens)
        self.req_pool_indices, self.seq_lens = z(max_bs), z(max_bs, dtype=torch.int32)
        steps = max(spec.draft_forwards, 1) if spec else 1
        self.cache_seqlens = [z(max_bs, dtype=torch.int32) for _ in range(steps)]
        self.cu_seqlens_k = [z(max_bs + 1, dtype=torch.int32) for _ in range(steps)]
        self.page_table = [z(max_bs, cfg.max_pages, dtype=torch.int32) for _ in range(steps)]
        self.cu_seqlens_q, self.accept = z(max_bs + 1, dtype=torch.int32), z(max_bs, dtype=torch.int32)
        self.strided = torch.arange(0, cfg.max_context_len, cfg.page_size, device=dev)
        n = spec.num_draft_tokens if spec else 1
        self.expand_table = z(tokens, n, dtype=torch.int32)
        self.expand_seqlens, self.expand_cu = z(tokens, dtype=torch.int32), z(tokens + 1, dtype=torch.int32)

    def prepare(self, batch: Batch) -> None:
        """Everything SGLang does on the host before ``graph.replay()`` for ``batch``."""
        mode, bs, n_tok = batch.mode, batch.bs, batch.num_tokens
        bucket = self.rt.dispatcher.policy.bucket_for(bs) or bs
        q = self.spec.num_draft_tokens if self.spec and mode is M.TARGET_VERIFY else 0
        delta = 1 if mode is M.DRAFT_DECODE else q  # SGLang's seq_lens exclude the step's drafts
        host_seq = batch.seq_lens - delta
        # NOTE: ScheduleBatch -> ForwardBatch: host arrays become device tensors.
        ids = torch.from_numpy(batch.input_ids).to(self.dev, non_blocking=True)
        seq = torch.from_numpy(host_seq).to(self.dev, non_blocking=True)
        rpi = torch.from_numpy(batch.req_pool_indices).to(self.dev, non_blocking=True)
        loc = torch.from_numpy(batch.out_cache_loc).to(self.dev, non_blocking=True)
        seq_cpu = torch.from_numpy(host_seq)
        positions = (
            (seq - 1).clamp_min(0) if mode is M.DECODE else torch.from_numpy(batch.positions).to(self.dev)
        )
        # replay_prepare: pad fill, then the input copies
        if bucket != bs:
            self.seq_lens.fill_(1)
            self.out_cache_loc.zero_()
        self.input_ids[:n_tok].copy_(ids)
        self.req_pool_indices[:bs].copy_(rpi)
        self.seq_lens[:bs].copy_(seq)
        k = min(loc.numel(), self.out_cache_loc.numel())
        self.out_cache_loc[:k].copy_(loc[:k])
        self.positions[:n_tok].copy_(positions)
        seqs, rows = self.seq_lens[:bucket], self.req_pool_indices[:bucket]
        if mode is M.DECODE:
            self._decode(0, seqs, rows, int(seq_cpu.max().item()), 0)
        elif mode is M.DRAFT_DECODE:
            for i in range(len(self.page_table)):
                self._decode(i, seqs, rows, int(seq_cpu.max().item()) + i + 1, i + 1)
        elif mode is M.TARGET_VERIFY and self.spec is not None and self.spec.topk > 1:
            self._tree(batch, seqs, rows, int(seq_cpu.max().item()))
        else:
            extra = q
            if mode is M.DRAFT_EXTEND:
                self.accept[:bs].copy_(torch.from_numpy(batch.q_lens).to(self.dev, non_blocking=True))
                _ = max(batch.q_lens.tolist()) + 1  # NOTE: max_seq_len_q from accept_length_cpu
                self.cu_seqlens_q[1 : bs + 1].copy_(torch.cumsum(self.accept[:bs], dim=0, dtype=torch.int32))
            self._decode(0, seqs, rows, int(seq_cpu.max().item()) + extra, extra)

    def _decode(self, i: int, seqs: torch.Tensor, rows: torch.Tensor, max_len: int, delta: int) -> None:
        """``normal_decode_set_metadata`` (and the verify/extend chain variant)."""
        cache, cu, table = self.cache_seqlens[i], self.cu_seqlens_k[i], self.page_table[i]
        n = seqs.numel()
        max_pages = (max_len + self.ps - 1) // self.ps
        cache[:n].copy_(seqs + delta)
        cu[1 : n + 1].copy_(torch.cumsum(cache[:n], dim=0, dtype=torch.int32))
        pages = self.table[rows[:, None], self.strided[:max_pages][None, :]]
        table[:n, :max_pages].copy_(pages // self.ps)

    def _tree(self, batch: Batch, seqs: torch.Tensor, rows: torch.Tensor, max_len: int) -> None:
        """The ``topk > 1`` verify path: prefix metadata, then the expand lists from the mask."""
        n, bs = self.spec.num_draft_tokens, batch.bs  # type: ignore[union-attr]
        self._decode(0, seqs, rows, max_len, 0)
        prefix = batch.seq_lens - n
        # NOTE: spec_info.custom_mask: per request [n, prefix + n], flattened, on the device.
        masks = [
            np.concatenate([np.ones((n, p), bool), m], axis=1).ravel()
            for p, m in zip(prefix, batch.tree_mask, strict=True)
        ]
        custom = torch.from_numpy(np.concatenate(masks)).to(self.dev, non_blocking=True)
        s = seqs[:bs].long()
        offsets = torch.arange(n, device=self.dev).unsqueeze(0)
        cols = offsets.expand(bs, -1) + s.unsqueeze(1)
        cum = torch.nn.functional.pad(torch.cumsum((s + n).repeat_interleave(n), dim=0), (1, 0))[:-1]
        idx = (cols.repeat_interleave(n, dim=0) + cum[:, None]).view(1, -1)
        mask = custom[idx].view(-1, n)
        col_idx = offsets.expand(mask.shape[0], n)
        keys = torch.where(mask, col_idx, col_idx + n)
        _, order = torch.sort(keys, dim=1)
        table = self.table[rows[:bs].long(), :].gather(1, cols).repeat_interleave(n, dim=0)
        self.expand_table[: bs * n].copy_(table.gather(1, order))
        self.expand_seqlens[: bs * n].copy_(mask.sum(dim=1))
        self.expand_cu[1 : bs * n + 1].copy_(
            torch.cumsum(self.expand_seqlens[: bs * n], dim=0, dtype=torch.int32)
        )

    def assert_same_pages(self, rt: GraphRuntime, batch: Batch) -> None:
        """The peer's page table equals graphrt's over each real row's pages (raises if not)."""
        ps, mine = self.ps, rt.groups.step.full["page_table"].cpu()
        theirs = self.page_table[-1 if batch.mode is M.DRAFT_DECODE else 0].cpu()
        keys = batch.seq_lens + rt.groups.draft_keys(batch.mode)
        if self.spec is not None and self.spec.topk > 1 and batch.mode is M.TARGET_VERIFY:
            keys = batch.seq_lens - self.spec.num_draft_tokens  # the prefix half of the cascade
        for r, k in enumerate(keys.tolist()):
            need = -(-k // ps)
            if not torch.equal(mine[r, :need], theirs[r, :need]):
                raise AssertionError(f"peer page table differs from graphrt's in row {r} ({batch.mode.name})")

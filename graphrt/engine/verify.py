"""One TARGET_VERIFY of a round's drafts, and the accepted path's KV moved into place.

Shared by the draft-model runner (:mod:`.speculative`) and the proposer runner (:mod:`.lookup`).
A verify's output per node is the target's token after it: its argmax for greedy requests, its
draw for sampled ones, both made inside the graph (:mod:`graphrt.runtime.verify_sampler`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from graphrt.engine.pages import slots_at
from graphrt.engine.sampling import row_params
from graphrt.engine.spec_tree import Accepted, TreeLayout
from graphrt.kv.move import move_slots
from graphrt.step.batch import Batch
from graphrt.step.modes import ForwardMode


def verify(
    target: Any,
    tree: TreeLayout,
    reqs: Sequence[Any],
    at: tuple[np.ndarray, np.ndarray, np.ndarray],
    drafts: np.ndarray,
    page_size: int,
    eager: bool,
) -> np.ndarray:
    """The target's token after every verify node, ``[bs, num_nodes]`` int64.

    ``at``: the requests' ``(rows [bs], page table [bs, pages], committed [bs])``, committed
    counting prompt and output; ``drafts [bs, topk, steps]``. A runtime that samples
    (``RuntimeConfig(sample=True)``) draws each sampled request's tokens in the graph.
    """
    rows, table, committed = at
    n, bs = tree.num_nodes, len(reqs)
    pending = np.array([r.output[-1] for r in reqs])
    sampled = target.config.sample
    batch = Batch.create(
        ForwardMode.TARGET_VERIFY,
        input_ids=tree.tokens(pending, drafts).reshape(-1),
        seq_lens=committed - 1 + n,
        req_pool_indices=rows,
        out_cache_loc=slots_at(
            table, np.arange(bs)[:, None], committed[:, None] - 1 + np.arange(n), page_size
        ).reshape(-1),
        q_lens=np.full(bs, n),
        tree_mask=tree.mask(bs),
        sampling=row_params([r.sampling for r in reqs]) if sampled else None,
    )
    out = target.run(batch, eager=eager)
    tokens = out if sampled else out.argmax(dim=-1)
    return tokens.cpu().numpy().reshape(bs, n)


def move_path(
    target_kv: Any, tree: TreeLayout, table: np.ndarray, committed: np.ndarray, acc: Accepted, page_size: int
) -> None:
    """Copy the target KV of each accepted draft from its node's slot to its position's.

    Node ``k`` sits at position ``m - 1 + k``; the next verify reads the path as positions
    ``m .. m + a - 1``. Moves within a request's own slots: its ledger entries stay valid.
    """
    req, src, dst = tree.moves(acc)
    if not req.size:
        return
    at = {key: committed[req] - 1 + nodes for key, nodes in (("src", src), ("dst", dst))}
    found = {key: slots_at(table, req, pos, page_size) for key, pos in at.items()}
    if any(int(s.min()) < 0 for s in found.values()):
        # NOTE: a position past a request's pages (-1 padded): this move does not pass
        # through run()'s checks, so refuse it here rather than write another page.
        raise RuntimeError("speculative KV move outside a request's pages")
    slots = {key: torch.as_tensor(s, device=target_kv.device) for key, s in found.items()}
    move_slots(target_kv, slots["src"], slots["dst"])

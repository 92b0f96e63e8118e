"""``graphrt bench sampler``'s extras rows: a sampling step with log-probabilities, penalties and
token masks, the torch code against the two Triton launches (``graphrt/runtime/sampler/extras.py``).

Per (batch size, vocabulary): greedy rows on the bench's Zipf logits, every row with a grammar's
mask (random bits, the best token allowed), penalties on counts of 64 earlier tokens, and
``MAX_LOGPROBS`` top log-probabilities. Paths, each captured ``REPS`` calls to a graph: ``draw``
(the sampler alone: the floor the extras add to), ``logprobs_torch`` / ``logprobs_fused`` (the
log-probabilities only: a request that asks for them), ``all_torch`` / ``all_fused`` (all three).
The fused and torch tokens must be equal and their log-probabilities within 1e-4 (exit 1).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from rich.table import Table

from graphrt import SamplingParams
from graphrt.metadata.sampling import sampling_inputs
from graphrt.runtime.penalties import TokenCounts
from graphrt.runtime.sampler.draw import sample
from graphrt.runtime.sampler.extras import sample_with_extras
from graphrt.runtime.token_mask import TokenMasks
from graphrt.step.sampling import MAX_LOGPROBS

PATHS = ("draw", "logprobs_torch", "logprobs_fused", "all_torch", "all_fused")
PENALTIES = SamplingParams(presence_penalty=0.5, frequency_penalty=0.3, repetition_penalty=1.1)


def _state(logits: torch.Tensor) -> tuple[TokenMasks, TokenCounts, torch.Tensor]:
    bs, vocab = logits.shape
    device, gen = logits.device, torch.Generator().manual_seed(bs + vocab)
    masks, counts = TokenMasks(bs, vocab, device), TokenCounts(bs, vocab, device)
    words = torch.randint(-(2**31), 2**31, (bs, masks.words), generator=gen).to(torch.int32)
    best = logits.float().argmax(dim=-1).cpu()
    words[torch.arange(bs), best // 32] |= (1 << (best % 32)).to(torch.int32)  # NOTE: a token stays allowed
    masks.masks.copy_(words)
    earlier = torch.randint(0, vocab, (bs, 64), generator=gen).to(device)
    counts.counts.scatter_add_(1, earlier, torch.ones_like(earlier, dtype=torch.int32))
    return masks, counts, torch.arange(bs, device=device)


def measure_extras(
    logits: torch.Tensor, time: Callable[[Callable[[], Any]], dict[str, float]] | None
) -> dict:
    """One (bs, vocabulary) case: tokens and log-probabilities compared; µs per call with ``time``."""
    bs, vocab = logits.shape
    params = sampling_inputs([PENALTIES] * bs, np.arange(bs), logits.device)
    masks, counts, rows = _state(logits)
    k = MAX_LOGPROBS

    def call(fused: bool, every: bool) -> Callable[[], Any]:
        extra = (masks, counts) if every else (None, None)
        return lambda: sample_with_extras(logits, rows, params, *extra, k, fused=fused)

    paths = {
        "draw": lambda: sample(logits, params),
        "logprobs_torch": call(False, False),
        "logprobs_fused": call(True, False),
        "all_torch": call(False, True),
        "all_fused": call(True, True),
    }
    before = counts.counts.clone()
    t_tokens, t_lp = paths["all_torch"]()
    added = counts.counts - before
    counts.counts.copy_(before)  # NOTE: the fused call sees the counts the torch call saw
    f_tokens, f_lp = paths["all_fused"]()
    row: dict[str, Any] = {
        "bs": bs,
        "vocab": vocab,
        "top_logprobs": k,
        "tokens_equal": bool(torch.equal(t_tokens, f_tokens)),
        "logprob_max_diff": float((t_lp - f_lp).abs()[:, : 1 + k].max().item()),
        "top_ids_equal": bool(torch.equal(t_lp[:, 1 + k :], f_lp[:, 1 + k :])),
        "counts_equal": bool(torch.equal(counts.counts - before, added)),
    }
    row["ok"] = row["tokens_equal"] and row["counts_equal"] and row["logprob_max_diff"] <= 1e-4
    row["us"] = None if time is None else {name: time(fn) for name, fn in paths.items()}
    return row


def extras_table(rows: list[dict[str, Any]]) -> Table:
    """µs p50 per call of every path, and the extras' cost over the draw (fused / torch)."""
    table = Table(title="sampler extras µs per call in a CUDA graph (p50): masks, penalties, top-20 logprobs")
    for col in ("bs", "vocab", *PATHS, "extras fused/torch", "check"):
        table.add_column(col, justify="right")
    for row in rows:
        us = {name: row["us"][name]["p50"] for name in PATHS} if row["us"] else None
        cells = [f"{us[name]:.1f}" for name in PATHS] if us else ["-"] * len(PATHS)
        ratio = "-" if not us else f"{(us['all_fused'] - us['draw']) / (us['all_torch'] - us['draw']):.2f}"
        check = "ok" if row["ok"] else f"tokens {row['tokens_equal']}, lp diff {row['logprob_max_diff']:.1e}"
        table.add_row(str(row["bs"]), str(row["vocab"]), *cells, ratio, check)
    return table

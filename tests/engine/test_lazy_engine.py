"""An engine that captures lazily generates the tokens of one that captures every graph first.

Greedy and seeded sampling (per-request seeds: a request's draws depend on its seed and
position only), continuous batching through buckets 4 and 1, the overlapped loop on (on CUDA a
capture then waits for the step in flight); ``LLM`` and ``graphrt serve`` build the same engine by default, and it captures lazily.
"""

from __future__ import annotations

import pytest
import torch

from graphrt import Engine, ForwardMode, SamplingParams
from graphrt.cli import build_parser
from graphrt.defaults import engine_defaults
from graphrt.tools.cli.serve import llm_options
from tests.engine.test_engine import PROMPTS

PROMPTS_USED = PROMPTS[:4]
BUDGETS = [5, 9, 3, 7]  # NOTE: decode batches of 4, 3, 2, 1 requests: buckets 4 and 1, never 8
SAMPLED = [SamplingParams(temperature=0.9, top_k=50, seed=11 + i) for i in range(len(PROMPTS_USED))]


def _generate(
    device: torch.device, capture: str, sampling: list[SamplingParams] | None
) -> tuple[list[list[int]], Engine]:
    engine = Engine(device=device, max_batch_size=8, max_context_len=128, buckets=(1, 4, 8), capture=capture)
    return engine.generate(PROMPTS_USED, BUDGETS, sampling), engine


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "seeded"])
def test_lazy_engine_generates_the_eager_engines_tokens(device: torch.device, sampled: bool) -> None:
    sampling = SAMPLED if sampled else None
    eager, e_engine = _generate(device, "eager", sampling)
    lazy, l_engine = _generate(device, "lazy", sampling)
    assert lazy == eager and [len(o) for o in lazy] == BUDGETS
    e_stats, l_stats = e_engine.stats(), l_engine.stats()
    assert l_stats.replays == e_stats.replays and l_stats.eager == e_stats.eager
    ladder = {t: 1 for t in (1, 2, 4, 8, 16, 32, 64, 128, 256)}  # NOTE: the prefill graphs' tokens
    assert e_stats.captures == {"DECODE": {1: 1, 4: 1, 8: 1}, "MIXED": ladder}
    # NOTE: each key the steps used, once: the one prefill (17 tokens) replays MIXED 32
    assert l_stats.captures == {"DECODE": {1: 1, 4: 1}, "MIXED": {32: 1}}
    unused = tuple((ForwardMode.MIXED, t) for t in sorted(ladder, reverse=True) if t != 32)
    assert l_engine.runtime.report().pending == ((ForwardMode.DECODE, 8), *unused)
    assert l_engine.capture_report is not None and l_engine.capture_report.graphs == ()  # NOTE: at build


def test_llm_and_serve_build_the_same_engine_by_default() -> None:
    args = build_parser().parse_args(["serve", "--device", "cpu"])
    served = llm_options(args)
    mine = engine_defaults({"device": served["device"]})
    assert mine["capture"] == served["capture"] == "lazy"
    for name in ("max_batch_size", "max_context_len", "max_logprobs", "penalties", "token_masks"):
        assert served[name] == mine[name], name
    # NOTE: with TP the engine's default, which every rank's plain engine shares
    assert engine_defaults({"device": "cpu", "tp": 2}).get("capture") is None

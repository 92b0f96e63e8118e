"""Lean graphs: on a runtime with sampler extras (log-probabilities, penalties, token masks) a
DECODE step whose rows need none of them replays its bucket's lean graph, which draws the tokens
the full graph draws (bit-equal, fp32 on the CPU, greedy and sampled rows); a step with a row
that asks for log-probabilities, has a penalty or follows a grammar keeps the full graph."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrt import Batch, Engine, ForwardMode, SamplingParams
from graphrt.step import FED
from tests.support.util import Setup, build_runtime, slot_of

CPU = torch.device("cpu")
ROWS = [0, 1, 2]
PROMPT_LENS = [4, 6, 5]
#: Greedy, sampled, sampled with top-k: none asks for an extra.
PLAIN = (
    SamplingParams(),
    SamplingParams(temperature=0.9, seed=5),
    SamplingParams(temperature=0.7, top_k=20, seed=9),
)
STEPS = 4
DECODE = ForwardMode.DECODE


def setup(**kw: object) -> Setup:
    options = {"sample": True, "token_masks": True, "penalties": True, "logprobs": 2} | kw
    return build_runtime(CPU, max_batch_size=4, max_reqs=4, max_context_len=64, buckets=(1, 2, 4), **options)


def decode(
    s: Setup, params: tuple[SamplingParams, ...], eager: bool = False, grammar: bool = False
) -> list[list[int]]:
    """Fresh requests in :data:`ROWS` (all-allowed masks, marked a grammar's when ``grammar``),
    their prompts' EXTEND, then :data:`STEPS` fed DECODE steps; each step's tokens."""
    rt = s.runtime
    assert rt.tokens is not None
    prompts = [
        np.random.default_rng(7 + r).integers(0, s.model.vocab_size, n)
        for r, n in zip(ROWS, PROMPT_LENS, strict=True)
    ]
    for r in ROWS:
        s.req_to_token.free(r)
    if rt.env.counts is not None:
        rt.env.counts.start(ROWS, [p.tolist() for p in prompts])
    if rt.env.masks is not None:
        rt.env.masks.staging()[1][: len(ROWS)] = -1
        rt.env.masks.upload(np.asarray(ROWS), grammar)
    rt.run(
        Batch.create(
            ForwardMode.EXTEND,
            input_ids=np.concatenate(prompts),
            seq_lens=PROMPT_LENS,
            req_pool_indices=ROWS,
            out_cache_loc=[
                slot_of(s, r, p) for r, n in zip(ROWS, PROMPT_LENS, strict=True) for p in range(n)
            ],
            q_lens=PROMPT_LENS,
            sampling=params,
        ),
        feed=rt.tokens.prefill,
    )
    tokens = []
    for i in range(STEPS):
        seq = [n + 1 + i for n in PROMPT_LENS]
        batch = Batch.create(
            DECODE,
            input_ids=[FED] * len(ROWS),
            seq_lens=seq,
            req_pool_indices=ROWS,
            out_cache_loc=[slot_of(s, r, n - 1) for r, n in zip(ROWS, seq, strict=True)],
            sampling=params,
        )
        tokens.append(rt.run(batch, eager=eager, feed=rt.tokens.decode).tolist())
    return tokens


def test_plain_rows_replay_the_lean_graph_with_the_full_graphs_tokens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s = setup()
    assert {(DECODE, b, "lean") for b in (1, 2, 4)} <= {g.key for g in s.runtime.report().graphs}
    eager = decode(s, PLAIN, eager=True)
    lean = decode(s, PLAIN)
    assert s.runtime.stats().lean == {"DECODE": STEPS} and s.runtime.logprobs is None
    monkeypatch.setattr(s.runtime._variant, "lean", lambda batch: False)
    full = decode(s, PLAIN)
    assert lean == full == eager
    assert s.runtime.stats().lean == {"DECODE": STEPS} and s.runtime.logprobs is not None


@pytest.mark.parametrize(
    "extra",
    [
        {"logprobs": 1},
        {"presence_penalty": 0.5},
        {"frequency_penalty": -0.5},
        {"repetition_penalty": 1.2},
        "grammar",
    ],
    ids=["logprobs", "presence", "frequency", "repetition", "grammar"],
)
def test_a_row_that_needs_an_extra_keeps_the_full_graph(extra: dict | str) -> None:
    s = setup()
    params = (
        PLAIN
        if extra == "grammar"
        else (PLAIN[0], SamplingParams(temperature=0.9, seed=5, **extra), PLAIN[2])
    )
    decode(s, params, grammar=extra == "grammar")
    assert s.runtime.stats().lean == {} and s.runtime.stats().replays["DECODE"] == STEPS
    decode(s, PLAIN)  # NOTE: the rows rewritten all-allowed, no grammar's: lean again
    assert s.runtime.stats().lean == {"DECODE": STEPS}


def test_a_runtime_without_extras_has_no_lean_graph() -> None:
    s = setup(token_masks=False, penalties=False, logprobs=0)
    assert not s.runtime.capturer.variants["lean"].modes
    assert all(len(g.key) == 2 for g in s.runtime.report().graphs)
    decode(s, PLAIN)
    assert s.runtime.stats().lean == {}


def test_a_lazy_runtime_captures_only_the_lean_graph_on_a_pending_keys_lean_step() -> None:
    s = setup(lazy=True, token_masks=False, penalties=False, logprobs=1)
    want = decode(setup(token_masks=False, penalties=False, logprobs=0), PLAIN)
    assert decode(s, PLAIN) == want
    report = s.runtime.report()
    assert {g.key for g in report.graphs} == {(DECODE, 4, "lean")} and (DECODE, 4) in report.pending
    assert s.runtime.stats().lean == {"DECODE": STEPS}
    asking = (PLAIN[0], SamplingParams(temperature=0.9, seed=5, logprobs=1), PLAIN[2])
    decode(s, asking)  # NOTE: the key's own graph, captured by the first step that needs it
    assert (DECODE, 4) in {g.key for g in s.runtime.report().graphs} and s.runtime.logprobs is not None
    assert decode(s, PLAIN) == want and s.runtime.stats().lean == {"DECODE": 2 * STEPS}
    s.runtime.capture_pending()
    keys = {g.key for g in s.runtime.report().graphs}
    assert {(DECODE, b, *part) for b in (1, 2, 4) for part in ((), ("lean",))} == keys


def test_the_servers_engine_decodes_plain_requests_through_lean_graphs() -> None:
    """``graphrt serve``'s extras on (log-probabilities, penalties, masks): requests that ask
    for none get the tokens of an engine without them, from lean DECODE graphs."""
    options = {"max_batch_size": 4, "max_context_len": 128}
    prompts = [[1, 2, 3, 4], [5, 6, 7], [9, 8, 7, 6, 5]]
    sampling = SamplingParams(temperature=0.8, top_p=0.9, seed=3)
    bare = Engine("tiny-llama", **options)
    want = bare.generate(prompts, 12, sampling)
    served = Engine("tiny-llama", **options, max_logprobs=5, penalties=True, token_masks=True)
    assert served.generate(prompts, 12, sampling) == want
    lean = served.runtime.stats().lean.get("DECODE", 0)
    assert lean > 0 and lean == served.runtime.stats().replays["DECODE"]

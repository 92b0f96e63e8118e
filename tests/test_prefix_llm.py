"""``LLM("smollm2")`` (fp32, CPU) gives the same greedy replies with and without prefix caching
to conversations sharing a system prompt; with caching the later ones reuse its pages."""

from __future__ import annotations

import pytest

from graphrt import LLM
from tests.tools.test_cli_generate import needs_smollm2

KW = {"device": "cpu", "max_batch_size": 4, "max_context_len": 256, "buckets": (1, 2, 4)}
SYSTEM = (
    "You are a careful assistant for a small museum of clocks. Answer in one short sentence, "
    "mention the room where the clock is kept, and never invent opening hours or prices."
)
QUESTIONS = ("Where is the water clock?", "Which clock is the oldest?", "Do you have a cuckoo clock?")


def chats() -> list[list[dict[str, str]]]:
    return [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}] for q in QUESTIONS]


@needs_smollm2
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graph"])
def test_smollm2_replies_are_the_same_with_and_without_caching(graphs: bool) -> None:
    replies = {}
    for caching in (False, True):
        llm = LLM("smollm2", **KW, use_graphs=graphs, prefix_caching=caching)
        first = llm.chat(chats()[0], max_new_tokens=12)  # NOTE: caches the system prompt's pages
        rest = llm.chat(chats()[1:], max_new_tokens=12)
        replies[caching] = [c.token_ids for c in first + rest]
        stats = llm.engine.stats().prefix
        if caching:
            assert stats is not None and stats.hit_requests == len(QUESTIONS) - 1
            assert stats.hit_tokens >= 32 * (len(QUESTIONS) - 1)
        else:
            assert stats is None
    assert replies[True] == replies[False]

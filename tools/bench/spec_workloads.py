"""``bench-spec --target``'s workloads: the committed prompt sets, random prompts, and the
always-match proposer of the pipeline-ceiling run.

- ``copy`` / ``chat`` (``bench/spec_prompts/<name>.jsonl``, one ``{"prompt": text}`` a line,
  through the model's chat template): edit or repeat given code and prose (much to copy), and
  questions with nothing to copy (speculation must back off). Each text to copy is about as
  long as a 256-token answer: ``generate`` has no stop token, so past a short answer a small
  model writes on (SmolLM2 invents a new chat turn) and the rest of the run has nothing to copy.
  The first prompt (the only one at batch size 1) is one SmolLM2 copies throughout.
- ``random``: random token prompts (``--prompt-len``), for models without a tokenizer.
- ``always-match``: random prompts whose continuation the proposer is given (the plain run's
  own greedy tokens): every draft matches until a near-tie flips a token, so the round costs
  of the pipeline are measured at full acceptance, whatever the weights.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

WORKLOADS = ("copy", "chat", "random", "always-match")
#: Where the committed prompt sets live (relative to the repository root).
PROMPTS_DIR = Path("bench/spec_prompts")


def prompt_ids(
    workload: str, model: str, vocab: int, count: int, length: int, prompts_dir: Path
) -> list[list[int]]:
    """``count`` prompts of ``workload`` as token ids (a prompt set repeats to fill ``count``)."""
    if workload in ("random", "always-match"):
        rng = np.random.default_rng(0)
        return [rng.integers(0, vocab, length).tolist() for _ in range(count)]
    from graphrt.text.tokenizer import chat_prompt, load_tokenizer

    tokenizer = load_tokenizer(model)
    lines = (prompts_dir / f"{workload}.jsonl").read_text().splitlines()
    texts = [json.loads(line)["prompt"] for line in lines if line.strip()]
    ids = [chat_prompt(tokenizer, t) for t in texts]
    return [ids[i % len(ids)] for i in range(count)]


class AlwaysMatch:
    """A proposer that drafts each request's known continuation (``continuations``, keyed by
    prompt) while its output follows it; nothing once the output departs from it."""

    def __init__(self, continuations: dict[tuple[int, ...], list[int]], steps: int) -> None:
        self.continuations, self.steps = continuations, steps

    def propose(self, prompt: Sequence[int], output: Sequence[int]) -> list[list[int]]:
        known, n = self.continuations.get(tuple(prompt)), len(output)
        if known is None or n > len(known) or (n and known[n - 1] != output[-1]):
            return []
        following = known[n : n + self.steps]
        return [following] if following else []

    def peek(
        self, prompt: Sequence[int], output: Sequence[int], tail: Sequence[int], count: int
    ) -> list[int]:
        """``count`` tokens of the continuation after ``output + tail`` (overlapped rounds), or []."""
        known, n = self.continuations.get(tuple(prompt)), len(output)
        if known is None or n > len(known) or (n and known[n - 1] != output[-1]):
            return []
        if list(known[n : n + len(tail)]) != list(tail):
            return []
        return known[n + len(tail) : n + len(tail) + count]

"""xgrammar masks of many requests filled in one call (``Constraint.fill_batch``, over xgrammar's
thread pool) equal each request's own ``fill``, row for row, whatever state each grammar is in
(the engine's mask writer sends a step's grammar rows through it: tests/serve's ``n = 2`` JSON
requests)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.tools.test_cli_generate import needs_smollm2

xgr = pytest.importorskip("xgrammar")

SCHEMA = {
    "type": "json_schema",
    "json_schema": {
        "name": "a",
        "schema": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
    },
}


def _constraints(n: int) -> tuple[list[Any], int]:
    from graphrt.text import load_tokenizer
    from graphrt.text.grammar import Grammars

    tokenizer = load_tokenizer("smollm2")
    vocab = tokenizer.backend.get_vocab_size()
    grammars = Grammars(tokenizer, vocab)
    texts = ['{"answer": "', "{", '{"answer": "yes"}', '{"answer": "y']
    made = []
    for i in range(n):
        c = grammars.constraint(grammars.compile(SCHEMA if i % 2 else {"type": "json_object"}))
        c.accept(tokenizer.backend.encode(texts[i % len(texts)], add_special_tokens=False).ids)
        made.append(c)
    return made, vocab


@needs_smollm2
@pytest.mark.parametrize("n", [1, 4, 7])
def test_a_batch_fill_equals_each_rows_own_fill(n: int) -> None:
    from graphrt.text.grammar import Constraint

    constraints, vocab = _constraints(n)
    words = (vocab + 31) // 32
    rows = [2 * i + 1 for i in range(n)]  # NOTE: rows spread over a larger staging buffer
    one = torch.full((2 * n + 2, words), 7, dtype=torch.int32)
    many = one.clone()
    for c, row in zip(constraints, rows, strict=True):
        c.fill(one, row)
    Constraint.fill_batch(constraints, many, rows)
    assert torch.equal(one, many)
    assert not torch.equal(one[rows[0]], torch.full((words,), -1, dtype=torch.int32))  # NOTE: a real mask
    assert (many[0] == 7).all()  # NOTE: rows outside ``indices`` untouched

"""``graphrt bench serve --bodies``: the names it takes (plain first, unknown ones refused) and
what a round's loads come to (medians, each body's tokens/s over plain's, replies compared
across rounds)."""

from __future__ import annotations

import argparse

import pytest

from graphrt.tools.bench.serve_bodies import _same_across_rounds, _summary, body_names
from graphrt.tools.bench.serve_load import Load, Sample


def test_body_names_put_plain_first_and_refuse_unknown_ones() -> None:
    assert body_names("schema,logprobs,schema") == ["plain", "schema", "logprobs"]
    assert body_names("logprobs,plain") == ["plain", "logprobs"]
    with pytest.raises(argparse.ArgumentTypeError, match=r"\['tools'\]"):
        body_names("logprobs,tools")


def _load(tokens_per_s: float, text: str = "a") -> Load:
    """A one-second load of two requests (``tokens_per_s`` tokens between them)."""
    half = int(tokens_per_s) // 2
    return Load([Sample(0.1, 1.0, half, text), Sample(0.1, 1.0, half, text)], wall_s=1.0)


def test_summary_takes_medians_and_the_ratio_to_plain() -> None:
    got = _summary([_load(100), _load(80), _load(90)], plain=100.0)
    assert got["throughput_tok_s"] == [100.0, 80.0, 90.0]
    assert got["median_tok_s"] == 90.0 and got["x_plain"] == 0.9
    assert got["median_tpot_p50_ms"] == pytest.approx(
        900 / 44, abs=1e-3
    )  # NOTE: the 90 tokens/s load: 45 a request


def test_replies_are_compared_across_rounds() -> None:
    same = _same_across_rounds(
        {"plain": [_load(10), _load(10)], "schema": [_load(10, "{}"), _load(10, "{ }")]}
    )
    assert same == {"plain": True, "schema": False}

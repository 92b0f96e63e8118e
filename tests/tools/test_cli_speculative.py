"""``--speculative`` on ``graphrt generate`` and ``graphrt serve``: parsed, checked, and greedy
output unchanged by it."""

from __future__ import annotations

import json

import pytest

from graphrt.cli import build_parser, main

BASE = ["generate", "--model", "tiny-llama", "--prompt-ids", "5,6,7,5,6,7,5,6", "--max-new-tokens", "8"]
BASE += ["--device", "cpu", "--max-context-len", "64", "--json"]


def test_serve_and_generate_parse_the_flag() -> None:
    parser = build_parser()
    assert parser.parse_args(["serve", "--speculative", "suffix"]).speculative == {"method": "suffix"}
    args = parser.parse_args(["generate", "--prompt", "hi", "--speculative", "method=ngram,num_steps=5"])
    assert args.speculative == {"method": "ngram", "num_steps": 5}
    assert parser.parse_args(["serve"]).speculative is None


def test_bad_value_ends_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*BASE, "--speculative", "method=ngram,topk=2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "topk must be 1, got 2" in err, err


@pytest.mark.slow
def test_generate_with_ngram_speculation_gives_the_greedy_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    outputs = []
    for extra in ([], ["--speculative", "ngram"]):
        assert main([*BASE, *extra]) == 0
        outputs.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1])["output_ids"])
    assert outputs[0] == outputs[1] and len(outputs[0]) == 8

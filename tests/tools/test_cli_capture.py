"""``graphrt generate --capture lazy|eager``: the same tokens; lazy says what it captured on first use."""

from __future__ import annotations

import json

import pytest

from graphrt.cli import build_parser, main

BASE = [
    "generate",
    "--model",
    "tiny-llama",
    "--prompt-ids",
    "1,2,3",
    "--max-new-tokens",
    "4",
    "--device",
    "cpu",
]


def test_generate_captures_lazily_by_default_with_the_same_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    assert build_parser().parse_args(BASE).capture == "lazy"
    outputs = {}
    for capture in ("eager", "lazy"):
        assert main([*BASE, "--json", "--capture", capture, "--log-level", "info"]) == 0
        out, err = capsys.readouterr()
        outputs[capture] = json.loads(out.strip().splitlines()[-1])["output_ids"]
        said = " ".join(err.split())  # NOTE: rich wraps the phases line
        assert " total " in said and ("captured on first use" in said) == (capture == "lazy"), said
    assert outputs["lazy"] == outputs["eager"] and len(outputs["lazy"]) == 4

"""``graphrt bench-spec --target``: the engine end to end, tokens compared, acceptance recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphrt.cli import main


@pytest.mark.slow
def test_bench_spec_target_compares_tokens_and_reports_acceptance(tmp_path: Path) -> None:
    argv = ["bench-spec", "--target", "tiny-llama", "--draft", "tiny-llama", "--device", "cpu"]
    argv += ["--batch-sizes", "2", "--topk", "1,2", "--num-steps", "2", "--max-new-tokens", "6"]
    argv += ["--prompt-len", "5", "--context", "96", "--out", str(tmp_path)]
    assert main(argv) == 0
    (result,) = [json.loads(p.read_text()) for p in tmp_path.glob("spec_accept_cpu_*.json")]
    assert [r["topk"] for r in result["rows"]] == [1, 2] and all(r["equal"] for r in result["rows"])
    for row in result["rows"]:  # NOTE: the draft is a copy of the target: every draft accepted
        assert row["acceptance_per_step"] == [1.0, 1.0] and row["mean_accept_length"] == 3.0


def test_agreement_names_where_each_request_departs() -> None:
    from graphrt.tools.bench.spec_accept import _agreement

    plain = [[1, 2, 3], [4, 5, 6], [7, 8]]
    assert _agreement([[1, 2, 3], [4, 9, 6], [7, 8, 0]], plain) == {
        "equal": False,
        "requests_equal": 1,
        "departures": [[1, 1], [2, 2]],
    }
    assert _agreement(plain, plain) == {"equal": True, "requests_equal": 3, "departures": []}

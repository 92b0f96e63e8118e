"""``graphrt bench-spec --target``: the engine end to end, tokens compared, acceptance recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphrt.cli import main


@pytest.mark.slow
def test_bench_spec_target_compares_tokens_and_reports_acceptance(tmp_path: Path) -> None:
    argv = ["bench-spec", "--target", "tiny-llama", "--draft", "tiny-llama", "--device", "cpu"]
    argv += ["--method", "draft_model,ngram", "--workload", "random", "--batch-sizes", "2", "--topk", "1,2"]
    argv += [
        "--num-steps",
        "2",
        "--max-new-tokens",
        "6",
        "--prompt-len",
        "5",
        "--context",
        "96",
        "--repeats",
        "2",
    ]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    (result,) = [json.loads(p.read_text()) for p in tmp_path.glob("spec_accept_cpu_random_*.json")]
    rows = result["rows"]
    assert [(r["spec"]["method"], r["spec"].get("topk")) for r in rows] == [
        ("draft_model", 1),
        ("draft_model", 2),
        ("ngram", None),
    ]
    assert all(r["equal"] and r["batch_size"] == 2 for r in rows) and result["plain"][0]["batch_size"] == 2
    for row in rows[:2]:  # NOTE: the draft is a copy of the target: every draft accepted
        assert row["acceptance_per_step"] == [1.0, 1.0] and row["mean_accept_length"] == 3.0
    assert all(r["ratio"] == r["tokens_per_s"] / r["plain_tokens_per_s"] for r in rows)
    for row in [*rows, result["plain"][0]]:  # NOTE: of 2 runs the median is the slower one
        assert len(row["runs_tokens_per_s"]) == 2 and row["tokens_per_s"] == min(row["runs_tokens_per_s"])


@pytest.mark.slow
def test_always_match_accepts_every_draft(tmp_path: Path) -> None:
    argv = ["bench-spec", "--target", "tiny-llama", "--device", "cpu", "--workload", "always-match"]
    argv += ["--method", "ngram", "--batch-sizes", "1", "--num-steps", "3", "--max-new-tokens", "13"]
    assert main([*argv, "--context", "64", "--out", str(tmp_path)]) == 0
    (result,) = [json.loads(p.read_text()) for p in tmp_path.glob("spec_accept_cpu_always-match_*.json")]
    (row,) = result["rows"]
    # 12 tokens after the first: 3 rounds of 4; the warm-up's 7 too (one round short of drafts)
    assert row["equal"] and row["acceptance_rate"] == 1.0 and row["tokens_per_round"] > 3.0


def test_agreement_names_where_each_request_departs() -> None:
    from graphrt.tools.bench.spec_accept import _agreement

    plain = [[1, 2, 3], [4, 5, 6], [7, 8]]
    assert _agreement([[1, 2, 3], [4, 9, 6], [7, 8, 0]], plain) == {
        "equal": False,
        "requests_equal": 1,
        "departures": [[1, 1], [2, 2]],
    }
    assert _agreement(plain, plain) == {"equal": True, "requests_equal": 3, "departures": []}


def test_replay_us_times_each_mode_of_a_proposer_engine(tmp_path: Path) -> None:
    """``--replay-us``: per engine, each mode's replays timed up to a device sync (a verify's
    and a backed-off round's DECODE beside plain's), counted as the runtime replayed them."""
    argv = ["bench-spec", "--target", "tiny-llama", "--device", "cpu", "--workload", "always-match"]
    argv += ["--method", "ngram", "--batch-sizes", "1", "--num-steps", "3", "--max-new-tokens", "13"]
    assert main([*argv, "--context", "64", "--replay-us", "--repeats", "1", "--out", str(tmp_path)]) == 0
    (result,) = [json.loads(p.read_text()) for p in tmp_path.glob("spec_accept_cpu_always-match_*.json")]
    (plain,), (row,) = result["plain"], result["rows"]
    assert set(plain["replay_us"]) == {"DECODE", "MIXED"} and plain["replay_us"]["DECODE"]["replays"] == 12
    assert {"TARGET_VERIFY", "MIXED"} <= set(row["replay_us"])
    for t in row["replay_us"].values():
        assert t["replay_us"] >= t["launch_us"] > 0 and t["update_us"] > 0

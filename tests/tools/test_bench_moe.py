"""``graphrt bench moe`` on the CPU: the cases it runs, the routed-expert bytes it counts (pad rows
read nothing), the JSON it writes (speeds not measured), and the check that stops a wrong path."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from graphrt.cli import main
from graphrt.models.presets import preset
from graphrt.tools.bench import moe as bench_moe
from graphrt.tools.bench.model_moe import dense_bytes, random_moe
from graphrt.tools.bench.model_twin import ParityError


def _argv(out: Path) -> list[str]:
    return ["bench", "moe", "--device", "cpu", "--batch-sizes", "1,3", "--iters", "2", "--out", str(out)]


def test_routed_bytes_count_distinct_experts_and_skip_pad_rows() -> None:
    x, w, routing = bench_moe._layer("qwen3-30b-a3b", 16, 9, torch.device("cpu"), 0, 32)
    routing.topk_ids[:9] = torch.arange(8, dtype=torch.int32)  # NOTE: 9 requests on the same 8 experts
    per_expert = (2 * 24 * 64 + 64 * 24) * 2
    assert bench_moe.routed_bytes((x, w, routing)) == (8, 8 * per_expert + 2 * 16 * 64 * 2)
    routing.topk_ids[:] = 128
    assert bench_moe.routed_bytes((x, w, routing))[0] == 0


def test_model_floor_counts_a_fused_shared_expert_once_as_dense() -> None:
    """``bench model``'s dense bytes are the same whether the shared expert runs as a dense MLP
    or as extra experts (its pieces are no routed expert's bytes, nor counted twice)."""
    cfg = preset("tiny-deepseek-moe")
    apart = replace(cfg, moe=replace(cfg.moe, fuse_shared=False))
    fused = random_moe(cfg, torch.device("cpu"), torch.float32)
    assert cfg.moe.shared_slots == 1 and apart.moe.shared_slots == 0
    assert dense_bytes(fused) == dense_bytes(random_moe(apart, torch.device("cpu"), torch.float32))


def test_cpu_run_checks_every_row_and_times_none(tmp_path: Path) -> None:
    assert main(_argv(tmp_path)) == 0
    (path,) = tmp_path.glob("moe_cpu_*.json")
    result = json.loads(path.read_text())
    assert result["bench"] == "moe_experts_in_graph" and result["speeds"].startswith("not measured")
    assert result["floor"] is None and result["kernel"]["enabled"] is False
    rows = result["rows"]
    assert [(r["shape"], r["tokens"], r["requests"]) for r in rows[:3]] == [
        ("qwen3-30b-a3b", 1, 1), ("qwen3-30b-a3b", 3, 3), ("gpt-oss-20b", 1, 1)
    ]  # fmt: skip
    assert [(r["tokens"], r["requests"]) for r in rows[6:]] == [(16, 9)] * 3
    for r in rows:
        assert r["paths"]["reference"]["rel_l2_vs_reference"] == 0.0 and r["paths"]["triton"]["us"] is None
        assert r["paths"]["sgl_align"] is None and r["floor_us"] is None
        topk = bench_moe.SHAPES[r["shape"]][1]
        assert 1 <= r["distinct_experts"][0] <= r["requests"] * topk


def test_a_path_that_computes_something_else_stops_the_bench(tmp_path: Path, monkeypatch) -> None:
    good = bench_moe.paths

    def wrong() -> dict:
        return good() | {"triton": lambda lay: bench_moe.fused_experts(*lay) * 1.05}

    monkeypatch.setattr(bench_moe, "paths", wrong)
    with pytest.raises(ParityError, match=r"qwen3-30b-a3b T=1 triton: outputs differ from the reference's"):
        main(_argv(tmp_path))

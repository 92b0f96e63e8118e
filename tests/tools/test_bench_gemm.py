"""``graphrt bench gemm`` on the CPU: the shapes it takes from the presets, the JSON it writes
(speeds not measured), and the agreement check that stops it when a path computes something else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from graphrt.cli import main
from graphrt.models.presets import preset
from graphrt.tools.bench import gemm as bench_gemm
from graphrt.tools.bench.model_twin import ParityError


def _argv(out: Path) -> list[str]:
    return ["bench", "gemm", "--device", "cpu", "--batch-sizes", "1,3", "--iters", "2", "--out", str(out)]


def test_projections_are_the_decode_weights() -> None:
    assert bench_gemm.projections(preset("llama-3.2-1b")) == [
        ("qkv", 2048, 3072), ("o", 2048, 2048), ("gate_up", 2048, 16384), ("down", 8192, 2048),
        ("lm_head", 2048, 128256),
    ]  # fmt: skip
    assert bench_gemm.projections(preset("llama-3-8b"))[:4] == [
        ("qkv", 4096, 6144), ("o", 4096, 4096), ("gate_up", 4096, 28672), ("down", 14336, 4096),
    ]  # fmt: skip


def test_cpu_run_checks_every_row_and_times_none(tmp_path: Path) -> None:
    assert main(_argv(tmp_path)) == 0
    (path,) = tmp_path.glob("gemm_cpu_*.json")
    result = json.loads(path.read_text())
    assert result["bench"] == "gemm_in_graph" and result["env"]["torch"] == torch.__version__
    assert result["speeds"].startswith("not measured") and result["floor"] is None
    assert result["kernel"] == {"enabled": False, "pdl": False}  # no CUDA, no interpreter
    rows = result["rows"]
    assert len(rows) == 2 * 10 and [r["m"] for r in rows[:2]] == [1, 3]
    qkv = rows[0]
    assert (qkv["model"], qkv["proj"], qkv["k"], qkv["n"]) == ("llama-3.2-1b", "qkv", 64, 96)
    assert qkv["weight_bytes"] == 64 * 96 * 2 and qkv["bytes"] == (64 * 96 + 64 + 96) * 2
    for r in rows:
        cublas = r["paths"]["cublas"]
        assert cublas["us"] is None and cublas["rel_l2_vs_cublas"] == 0.0
        assert r["paths"]["skinny"] is None and r["paths"]["skinny_pdl"] is None
        assert r["floor_us"] is None and r["best_over_floor"] is None


def test_a_path_that_computes_something_else_stops_the_bench(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = bench_gemm.paths

    def wrong(device: torch.device) -> dict:
        return good(device) | {"skinny": lambda x, w: torch.matmul(x, w.t()) * 1.05}

    monkeypatch.setattr(bench_gemm, "paths", wrong)
    with pytest.raises(ParityError, match=r"llama-3.2-1b qkv M=1 skinny: outputs differ from cuBLAS's"):
        main(_argv(tmp_path))
    assert not list(tmp_path.glob("*.json"))

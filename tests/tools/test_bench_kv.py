"""``graphrt bench model --kv-cache-dtype fp8_e4m3`` on the CPU: both caches timed on the same
inputs, their logits compared, the bytes each step reads; a cache that cannot fit is skipped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphrt.cli import main
from graphrt.tools.bench import kv as bench_kv

ARGV = ["bench", "model", "--device", "cpu", "--shape", "tiny-llama", "--kv-cache-dtype", "fp8_e4m3"]
ARGV += ["--batch-sizes", "1,3", "--context", "20", "--iters", "2"]


def test_fp8_and_model_kv_steps_on_the_same_inputs(tmp_path: Path) -> None:
    assert main([*ARGV, "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("kv_cpu_tiny-llama_*.json")
    result = json.loads(path.read_text())
    caches = result["caches"]
    assert caches["auto"]["kv_dtype"] == "float32" and caches["fp8_e4m3"]["kv_dtype"] == "float8_e4m3fn"
    assert caches["auto"]["kv_bytes"] == 4 * caches["fp8_e4m3"]["kv_bytes"]
    for row in result["rows"]:
        model_kv, fp8 = row["auto"], row["fp8_e4m3"]
        assert model_kv["kv_read_bytes"] == 4 * fp8["kv_read_bytes"] == 4 * row["bs"] * 21 * 1024
        assert 0 < row["parity"]["rel_l2"] <= bench_kv.FP8_TOLERANCE and row["parity"]["passed"]
        assert row["fp8_over_bf16"] == pytest.approx(fp8["graphrt_us"]["p50"] / model_kv["graphrt_us"]["p50"])


def test_a_cache_that_cannot_fit_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With room for the FP8 cache only (the shape of bs 64 x 8k on an 80 GB H100), the model's
    KV is reported as skipped with the bytes it needs, and FP8 is still timed."""
    cfg_tokens = 3 * 32  # max bs x capacity(20)
    fp8_need = bench_kv.need_bytes(cfg_tokens * 1024, 20, 512)
    monkeypatch.setattr(bench_kv, "_free_bytes", lambda device: fp8_need + 1)
    assert main([*ARGV, "--out", str(tmp_path)]) == 0
    result = json.loads(next(tmp_path.glob("kv_cpu_*.json")).read_text())
    assert (
        "needs" in result["caches"]["auto"]["skipped"] and result["caches"]["auto"]["need_bytes"] > fp8_need
    )
    assert all(
        r["auto"] is None and r["fp8_e4m3"]["graphrt_us"]["p50"] > 0 and "parity" not in r
        for r in result["rows"]
    )

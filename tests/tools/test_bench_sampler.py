"""``graphrt bench sampler``: every case recorded, tokens compared on CUDA, no speeds on the CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from graphrt.cli import main
from graphrt.runtime.sampler.draw import ENV as SAMPLER_ENV
from graphrt.tools.bench.sampler import KINDS, measure, zipf_logits
from graphrt.tools.bench.sampler_extras import measure_extras
from tests.support.triton_util import INTERPRET


def test_cpu_run_records_every_case_without_speeds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["bench", "sampler", "--device", "cpu", "--batch-sizes", "1,3", "--vocabs", "1000,300"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("sampler_cpu_*.json")
    result = json.loads(path.read_text())
    assert {"timestamp", "git_commit", "args", "env"} <= set(result) and not result["speeds_measured"]
    cases = [(r["vocab"], r["bs"], r["rows"]) for r in result["rows"]]
    assert cases == [(v, bs, kind) for v in (1000, 300) for bs in (1, 3) for kind in KINDS]
    assert all(r["us"] is None and r["tokens_equal"] is None for r in result["rows"])
    assert result["extras"] == [], "no fused extras on the CPU without the interpreter"
    assert "speeds are not measured" in capsys.readouterr().out


def test_zipf_logits_have_a_real_nucleus() -> None:
    """The bench's logits: bf16, reproducible, and top_p=0.9 keeps tens of tokens, not 1 or all."""
    logits = zipf_logits(2, 49152, torch.device("cpu"))
    assert logits.dtype == torch.bfloat16 and logits.shape == (2, 49152)
    assert torch.equal(logits, zipf_logits(2, 49152, torch.device("cpu")))
    probs = torch.softmax(logits.float(), dim=-1).sort(dim=-1, descending=True).values
    nucleus = (probs.cumsum(dim=-1) - probs < 0.9).sum(dim=-1)
    assert ((nucleus > 10) & (nucleus < 1000)).all(), nucleus


@pytest.mark.skipif(not INTERPRET, reason="CPU tensors through Triton's interpreter (TRITON_INTERPRET=1)")
def test_extras_case_compares_torch_and_fused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the interpreter: masks, penalties and top-20 logprobs, torch against the kernels."""
    monkeypatch.setenv(SAMPLER_ENV, "interpret")
    row = measure_extras(zipf_logits(3, 700, torch.device("cpu")), None)
    assert row["ok"] and row["tokens_equal"] and row["counts_equal"] and row["us"] is None
    assert row["logprob_max_diff"] <= 1e-4 and row["top_logprobs"] == 20


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
def test_cuda_extras_case_compares_torch_and_fused() -> None:
    row = measure_extras(zipf_logits(8, 49152, torch.device("cuda")), None)
    assert row["ok"], row


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
def test_cuda_case_times_every_path_and_compares_tokens() -> None:
    row = measure(8, 49152, "top_p=0.9", 5, torch.device("cuda"))
    assert row["tokens_equal"] and row["rows_differing"] == 0
    assert set(row["us"]) == {"torch", "fused", "fused_no_pdl", "argmax", "launch"}
    assert all(0 < stats["p50"] < 1e5 for stats in row["us"].values())

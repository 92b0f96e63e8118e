"""``graphrt bench model`` on the CPU: the JSON it writes, its parity check (which must stop the
bench when the two models do not hold the same weights), and its defaults."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from graphrt.cli import main
from graphrt.models.llama import TinyLlama
from graphrt.models.presets import PRESETS
from graphrt.tools.bench import model as bench_model
from graphrt.tools.bench import model_steps as bench_steps
from graphrt.tools.bench.model_twin import ParityError, hf_twin, random_llama, step_read_bytes, weight_bytes

pytest.importorskip("transformers")


def _argv(out: Path, sizes: str = "1,3") -> list[str]:
    return [
        "bench", "model", "--device", "cpu", "--shape", "tiny-llama", "--batch-sizes", sizes,
        "--context", "20", "--iters", "2", "--out", str(out),
    ]  # fmt: skip


def test_writes_parity_floor_and_step_times(tmp_path: Path) -> None:
    assert main(_argv(tmp_path)) == 0
    (path,) = tmp_path.glob("model_cpu_tiny-llama_*.json")
    result = json.loads(path.read_text())
    assert result["bench"] == "model_decode" and result["shape"] == "tiny-llama"
    assert result["env"]["torch"] == torch.__version__ and result["dtype"] == "float32"
    assert result["args"]["batch_sizes"] == [1, 3] and result["context"] == 20
    assert result["parity_check"]["passed"] and result["parity_check"]["tolerance"] == 1e-3
    assert 0 < result["read_bytes"] < result["weight_bytes"]  # the embedding table is not read
    floor = result["floor"]
    assert floor["copy_bytes"] == result["read_bytes"]
    assert floor["floor_us"] == pytest.approx(floor["copy_us"]["p50"] / 2)
    assert floor["bandwidth_gb_s"] == pytest.approx(2 * result["read_bytes"] / floor["copy_us"]["p50"] / 1e3)
    assert result["graph_replays"] > 0 and result["eager_fallbacks"] == {}
    assert [r["bs"] for r in result["rows"]] == [1, 3]
    for row in result["rows"]:
        parity = row["parity"]["transformers"]
        assert parity["passed"] and parity["rel_l2"] < 1e-3 and parity["top1_agree"] == 1.0
        for key in ("graphrt_us", "host_us", "steady_us", "hf_eager_us"):
            assert row[key]["p10"] <= row[key]["p50"] <= row[key]["p90"]
        assert row["over_floor"] == pytest.approx(row["graphrt_us"]["p50"] / floor["floor_us"])
        assert row["hf_compiled_us"] is None and "CUDA only" in row["compile_skipped"]
        assert row["floor_with_kv_us"] > floor["floor_us"]


def _perturb_o_proj(hf: Any) -> None:
    proj = hf.model.layers[1].self_attn.o_proj
    proj.weight = torch.nn.Parameter(proj.weight * 1.05, requires_grad=False)


def _swap_gate_up(hf: Any) -> None:
    mlp = hf.model.layers[0].mlp
    mlp.gate_proj.weight, mlp.up_proj.weight = mlp.up_proj.weight, mlp.gate_proj.weight


@pytest.mark.parametrize("damage", [_perturb_o_proj, _swap_gate_up], ids=["o_proj_x1.05", "gate_up_swapped"])
def test_parity_check_stops_the_bench_when_weights_differ(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: Any
) -> None:
    def damaged_twin(model: Any, max_positions: int) -> Any:
        hf = hf_twin(model, max_positions)
        damage(hf)  # NOTE: a new tensor in transformers only; graphrt keeps its weights
        return hf

    monkeypatch.setattr(bench_model, "hf_twin", damaged_twin)
    with pytest.raises(ParityError, match=r"bs 1: graphrt vs transformers \(eager\): logits differ"):
        main(_argv(tmp_path, "1"))
    assert not list(tmp_path.glob("*.json"))  # nothing timed, nothing written


def test_twin_shares_graphrt_weights() -> None:
    model = random_llama(bench_model.preset("tiny-llama"), torch.device("cpu"), torch.float32, seed=1)
    hf = hf_twin(model, 64)
    ours = {p.untyped_storage().data_ptr() for p in model.parameters()}
    assert {p.untyped_storage().data_ptr() for p in hf.parameters()} == ours
    assert sum(p.numel() for p in hf.parameters()) == sum(p.numel() for p in model.parameters())
    embed = model.embed.weight
    assert weight_bytes(model) - step_read_bytes(model) == embed.numel() * embed.element_size()


def test_refuses_shapes_it_cannot_compare(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    for shape in ("tiny-dsa", "tiny-llama-swa", "nope"):
        argv = _argv(tmp_path)
        argv[argv.index("tiny-llama")] = shape
        assert main(argv) == 2
        assert f"--shape: '{shape}'" in capsys.readouterr().err


def test_default_batch_sizes_per_target(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, tuple[int, ...]] = {}

    def fake(name: str) -> Any:
        def run(args: argparse.Namespace) -> int:
            seen[name] = args.batch_sizes
            return 0

        return run

    monkeypatch.setattr(bench_model, "run_bench_model", fake("model"))
    monkeypatch.setattr("graphrt.tools.bench.decode.run_bench", fake("decode"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # NOTE: auto means CUDA here
    assert main(["bench", "model"]) == 0 and main(["bench"]) == 0
    assert seen == {"model": (1, 16, 64), "decode": (1, 8, 64)}


def test_cpu_defaults_of_the_model_bench_are_small(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[argparse.Namespace] = []
    monkeypatch.setattr(bench_model, "run_bench_model", lambda args: seen.append(args) or 0)
    assert main(["bench", "model", "--device", "cpu"]) == 0
    assert main(["bench", "model", "--device", "cpu", "--context", "64", "--batch-sizes", "2"]) == 0
    small, given = seen
    assert (small.batch_sizes, small.context, small.iters) == ((1, 4), 128, 10)
    assert (given.batch_sizes, given.context, given.iters) == ((2,), 64, 10)


def test_compile_budget_skips_what_would_overrun() -> None:
    budget = bench_steps.CompileBudget(100.0)
    assert budget.allows()
    budget.add(60.0)
    assert not budget.allows()  # 60 spent + 60 more (the last compile) > 100
    roomy = bench_steps.CompileBudget(200.0)
    roomy.add(60.0)
    assert roomy.allows()


def test_tied_head_is_read_whole_and_matches_transformers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tied = replace(bench_model.preset("tiny-llama"), tie_word_embeddings=True)
    monkeypatch.setitem(PRESETS, "tiny-llama-tied", tied)
    monkeypatch.delenv("GRAPHRT_PDL", raising=False)
    argv = _argv(tmp_path, "2")
    argv[argv.index("tiny-llama")] = "tiny-llama-tied"
    assert main(argv) == 0  # NOTE: the parity check against transformers' tied head passed
    (path,) = tmp_path.glob("model_cpu_tiny-llama-tied_*.json")
    result = json.loads(path.read_text())
    assert result["config"]["tie_word_embeddings"] and result["parity_check"]["passed"]
    assert result["read_bytes"] == result["weight_bytes"]  # one table: looked up, and read as the head
    assert result["rows"][0]["graph_nodes"] > 0
    # the emulated graph's topology: no op launches with PDL on the CPU; the switches recorded
    assert result["rows"][0]["pdl_edges"] == 0 and result["graphs"]["per_graph"][0]["pdl_edges"] == 0
    assert result["pdl_switch"] == {"GRAPHRT_PDL": "1"}


def test_llama_3_2_1b_reads_its_published_bytes() -> None:
    """The 1B preset: 1.236 G parameters, all read per step (tied head), 2.47 GB in bf16."""
    cfg = bench_model.preset("llama-3.2-1b")
    with torch.device("meta"):
        model = TinyLlama(cfg).to(torch.bfloat16)
    assert model.lm_head.weight is model.embed.weight
    assert step_read_bytes(model) == weight_bytes(model) == 2 * 1_235_814_400
    assert bench_model.resolve_shape("llama-3.2-1b", torch.device("cpu"))[1] is cfg

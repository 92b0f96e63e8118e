"""``graphrt tune`` with MoE presets on the CPU: the weights and experts it times per preset, the
parts it sweeps, the MoE candidates, the pick from given timings, the reference check that stops
a wrong candidate (Triton's interpreter), and the table's separate skinny down tiles."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import pytest
import torch

from graphrt.kernels import tuning
from graphrt.kernels.switches import triton
from graphrt.kernels.tuning import MoeTiles, TableError
from graphrt.models.presets import preset
from graphrt.tools.bench import gemm, tune, tune_moe, tune_shapes
from graphrt.tools.bench import moe as bench_moe
from graphrt.tools.bench.model_twin import ParityError
from graphrt.tools.cli.args import UsageError

BASE = tuning.DEFAULT.moe


def test_moe_presets_time_attention_lm_head_and_only_their_dense_mlps() -> None:
    got = tune_shapes.shapes(["qwen3-30b-a3b", "gpt-oss-20b", "tiny-qwen3-moe"])
    assert got[:6] == [
        ("qwen3-30b-a3b", "qkv", 2048, 5120), ("qwen3-30b-a3b", "o", 4096, 2048),
        ("qwen3-30b-a3b", "lm_head", 2048, 151936), ("gpt-oss-20b", "qkv", 2880, 5120),
        ("gpt-oss-20b", "o", 4096, 2880), ("gpt-oss-20b", "lm_head", 2880, 201088),
    ]  # fmt: skip
    # NOTE: tiny-qwen3-moe's layer 0 is dense (mlp_only_layers): its MLP is timed
    assert [s[1] for s in got[6:]] == ["qkv", "o", "gate_up", "down", "lm_head"]
    dense = tune_shapes.shapes(["llama-3.2-1b"], shrink=2)
    assert dense == [
        ("llama-3.2-1b", n, k // 2, v // 2) for n, k, v in gemm.projections(preset("llama-3.2-1b"))
    ]
    assert tune.shapes is tune_shapes.shapes


def test_an_mla_moe_preset_times_no_attention_and_says_so() -> None:
    """deepseek-v2-lite's shared expert runs in the expert kernels (two extra experts): no shared
    GEMMs; with the fusion off, its dense shared MLP's two are timed."""
    got = tune_shapes.shapes(["deepseek-v2-lite"])
    assert got == [
        ("deepseek-v2-lite", "gate_up", 2048, 2 * 10944), ("deepseek-v2-lite", "down", 10944, 2048),
        ("deepseek-v2-lite", "lm_head", 2048, 102400),
    ]  # fmt: skip
    cfg = preset("deepseek-v2-lite")
    apart = replace(cfg, moe=replace(cfg.moe, fuse_shared=False))
    assert tune_shapes.projections(apart)[2:4] == [
        ("shared_gate_up", 2048, 2 * 2816), ("shared_down", 2816, 2048)
    ]  # fmt: skip
    (note,) = tune_shapes.notes(["llama-3.2-1b", "deepseek-v2-lite"])
    assert note.startswith("deepseek-v2-lite: its MLA attention projections are not swept")
    with pytest.raises(UsageError, match="'tiny-mla' is not a Llama-style preset"):
        tune_shapes.shapes(["tiny-mla"])


def test_expert_shapes_are_bench_moes() -> None:
    for name, shape in bench_moe.SHAPES.items():
        assert tune_shapes.expert_shape(name) == shape
    assert tune_shapes.expert_shape("llama-3-8b") is None
    assert tune_shapes.moe_models(["llama-3-8b", "gpt-oss-20b", "tiny-mixtral"]) == [
        "gpt-oss-20b",
        "tiny-mixtral",
    ]


def _args(models: str, only: str | None = None) -> argparse.Namespace:
    return argparse.Namespace(models=models.split(","), only=only.split(",") if only else None)


def test_the_moe_part_runs_by_default_only_with_a_moe_preset() -> None:
    assert tune.parts(_args("llama-3.2-1b,llama-3-8b")) == ("skinny", "prologue", "decode")
    assert tune.parts(_args("llama-3.2-1b,qwen3-30b-a3b")) == ("skinny", "prologue", "decode", "moe")
    assert tune.parts(_args("qwen3-30b-a3b", "moe")) == ("moe",)
    with pytest.raises(UsageError, match="has no MoE preset"):
        tune.parts(_args("llama-3.2-1b", "moe"))
    with pytest.raises(UsageError, match="names no part"):
        tune.parts(_args("qwen3-30b-a3b", "experts"))


def test_candidates_start_at_the_base_and_vary_one_kernel_each() -> None:
    up, down, split, grouped = (
        f(BASE)
        for f in (
            tune_moe.up_candidates,
            tune_moe.down_candidates,
            tune_moe.split_candidates,
            tune_moe.grouped_candidates,
        )
    )
    assert [t.skinny_down_split for t in split] == [1, *tune_moe.SPLITS] and split[0] == BASE
    n, k, w = BASE.skinny_down()
    pinned = replace(BASE, skinny_down_n=n, skinny_down_k=k, skinny_down_warps=w)
    assert up[0] == pinned and down[0] == pinned and grouped[0] == BASE
    assert {t.skinny_up() for t in up} == set(tune_moe.UP) and {t.skinny_down() for t in up} == {
        BASE.skinny_down()
    }
    assert {t.skinny_down() for t in down} == set(tune_moe.DOWN) and {t.skinny_up() for t in down} == {
        BASE.skinny_up()
    }
    assert {(t.block_n, t.block_k, t.warps, t.stages) for t in grouped} == set(tune_moe.GROUPED)
    assert all(len(c) == len(set(c)) for c in (up, down, split, grouped))
    # NOTE: the time budget (docs/gpu.md): per MoE preset, one compile and timing per candidate
    assert len(up) + len(down) + len(split) + len(grouped) * len(tune_moe.GROUPED_T) <= 24


def test_search_picks_up_then_down_then_grouped_from_the_timings() -> None:
    shape = bench_moe.SHAPES["qwen3-30b-a3b"]
    skinny, grouped = tune_moe.cases([("a", shape), ("b", shape)])
    assert [(c.model, c.tokens, c.skinny) for c in skinny + grouped] == [
        ("a", 1, True), ("b", 1, True), ("a", 16, False), ("a", 64, False), ("b", 16, False), ("b", 64, False)
    ]  # fmt: skip
    seen: list[tuple[tune_moe.Case, MoeTiles]] = []

    def timer(case: tune_moe.Case, t: MoeTiles) -> float:
        seen.append((case, t))
        if case.skinny:  # NOTE: up (16, 2048, 8) best on a, (4, 2048, 4) on b, by less in sum
            us = {
                (16, 2048, 8): 5.0 if case.model == "a" else 9.0,
                (4, 2048, 4): 8.0 if case.model == "a" else 7.0,
            }
            down = {(16, 256, 4): -2.0, (8, 512, 4): -1.0}.get(t.skinny_down(), 0.0)
            down += {4: -0.5, 8: -0.25}.get(t.skinny_down_split, 0.0)
            return us.get(t.skinny_up(), 10.0) + down
        return {(128, 64, 8, 3): 1.0, (32, 64, 8, 3): 2.0}.get((t.block_n, t.block_k, t.warps, t.stages), 3.0)

    got = tune_moe.search(timer, skinny, grouped, BASE)
    assert (
        got.skinny_up() == (16, 2048, 8) and got.skinny_down() == (16, 256, 4) and got.skinny_down_split == 4
    )
    assert (got.block_n, got.block_k, got.warps, got.stages) == (128, 64, 8, 3)
    # NOTE: 2 presets x (5 up + 5 down + 4 splits) skinny timings, then 2 x 2 token counts x 5 grouped
    assert [c.skinny for c, _ in seen] == [True] * 28 + [False] * 20
    flat = lambda case, t: 1.0  # noqa: E731
    assert (
        tune_moe.search(flat, skinny, grouped, BASE) == tune_moe.up_candidates(BASE)[0]
    )  # NOTE: ties keep the base


@pytest.mark.skipif(triton is None, reason="needs Triton (its interpreter on the CPU)")
def test_the_bench_checks_every_candidate_against_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    shape = (8, 2, 64, 48, "swiglu_clamp", True)
    skinny, grouped = tune_moe.cases([("tiny", shape)])
    bench = tune_moe.Bench(tuning.DEFAULT, 1, torch.device("cpu"))
    small = replace(BASE, skinny_n=4, skinny_k=32, skinny_down_n=16, skinny_down_k=16, block_n=16, block_k=16)
    for case in (skinny[0], grouped[0]):
        assert bench(case, small) == 0.0  # NOTE: the CPU times nothing; the output was checked
    assert [(r["tokens"], r["rel_l2_vs_reference"] < 1e-2) for r in bench.rows] == [(1, True), (16, True)]
    wrong = lambda x, w, ids, weights: 2 * bench_moe.experts_reference(x, w, ids, weights)  # noqa: E731
    monkeypatch.setattr(tune_moe, "experts_reference", wrong)
    with pytest.raises(ParityError, match="graphrt tune moe: tiny T=1"):
        tune_moe.Bench(tuning.DEFAULT, 1, torch.device("cpu"))(skinny[0], small)


def test_down_tiles_survive_the_file_and_older_files_read_as_the_up_tiles() -> None:
    tiles = replace(BASE, skinny_n=16, skinny_down_n=32, skinny_down_k=256, skinny_down_warps=4)
    table = replace(tuning.DEFAULT, moe=tiles)
    doc = json.loads(json.dumps(tuning.as_json(table, "x")))
    assert tuning.parse(doc, "x", "mem").moe == tiles and tiles.skinny_down() == (32, 256, 4)
    for name in ("skinny_down_n", "skinny_down_k", "skinny_down_warps"):
        doc["moe"].pop(name)  # NOTE: a table written before the down fields
    old = tuning.parse(doc, "x", "mem").moe
    assert old.skinny_down() == old.skinny_up() == (16, BASE.skinny_k, BASE.skinny_warps)
    doc["moe"]["skinny_down_k"] = 96
    with pytest.raises(TableError, match=r"field moe: MoeTiles\.skinny_down_k must be a power of two"):
        tuning.parse(doc, "x", "mem")
    with pytest.raises(ValueError, match="skinny_n must be >= 2"):
        MoeTiles(skinny_n=1)

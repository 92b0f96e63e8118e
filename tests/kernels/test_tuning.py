"""Per-GPU tuning tables: which table a device gets, the file format's checks, the kernels
following the installed table, the capture report and ``graphrt inspect`` naming it, and
``graphrt tune`` (refused without CUDA; a tiny sweep on a GPU)."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from graphrt.attention.split_decode import attend as dk
from graphrt.cli import main
from graphrt.kernels import prologue, skinny, switches, tuning
from graphrt.kernels.moe import triton_experts as te
from graphrt.kernels.tuning import SamplerRule, ShapeTile, SkinnyRule, TableError, Tile
from graphrt.runtime.sampler import launch as sampler_launch
from tests.support.triton_util import triton_devices
from tests.support.tuning_util import patch_tuning

H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"


def _tunables(table: tuning.TuningTable) -> tuning.TuningTable:
    return replace(table, name="", path="", source=())


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The user cache under ``tmp_path`` (``XDG_CACHE_HOME``), switches read anew."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("GRAPHRT_CACHE", raising=False)
    switches.forget()
    yield tmp_path / "graphrt" / "tuning"
    switches.forget()


def test_device_keys() -> None:
    assert tuning.device_key(H100) == "NVIDIA_H100_80GB_HBM3"
    assert tuning.device_key(H200) == "NVIDIA_H200"
    assert tuning.device_key("  AMD Instinct MI300X / x ") == "AMD_Instinct_MI300X_x"
    with pytest.raises(ValueError, match="no letters or digits"):
        tuning.device_key(" - ")


@pytest.mark.parametrize("name", [H100, H200])
def test_committed_tables_load_for_known_devices(cache: Path, name: str) -> None:
    table = tuning.choose(name)
    key = tuning.device_key(name)
    assert table.name == key and table.path == str(tuning.COMMITTED / f"{key}.json")
    source = dict(table.source)
    assert set(source) == {"skinny", "prologue", "decode", "sampler", "moe"}
    if name == H100:  # NOTE: the H100's sweeps are the built-in defaults
        assert _tunables(table) == _tunables(tuning.DEFAULT)
        return
    # NOTE: the H200's GEMM and decode parts are its own sweep; the rest says it is the H100's
    swept = {"skinny", "prologue", "decode"}
    assert all("graphrt tune on NVIDIA H200" in source[part] for part in swept)
    assert all("not swept on the H200" in source[part] for part in set(source) - swept)
    assert table.skinny_rules != tuning.DEFAULT.skinny_rules
    assert (table.sampler_layouts, table.moe) == (tuning.DEFAULT.sampler_layouts, tuning.DEFAULT.moe)


def test_unknown_devices_and_the_cpu_get_the_defaults(cache: Path) -> None:
    from graphrt.tools.bench.record import header

    assert header("x", argparse.Namespace(), torch.device("cpu"))["tuning"] == {
        "name": "default",
        "path": "built-in",
    }
    assert tuning.choose("NVIDIA GeForce RTX 4090") is tuning.DEFAULT
    assert tuning.choose(None) is tuning.DEFAULT
    assert tuning.install_for(torch.device("cpu")) is tuning.DEFAULT
    assert tuning.active() is tuning.DEFAULT


def test_the_user_cache_wins_over_the_committed_table(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mine = replace(tuning.DEFAULT, skinny_rules=(SkinnyRule(64, 1 << 62, Tile(16, 512, 4)),), decode_waves=3)
    path = tuning.write(mine, H100, cache / "NVIDIA_H100_80GB_HBM3.json")
    assert tuning.cache_path(H100) == path
    got = tuning.choose(H100)
    assert got.path == str(path) and _tunables(got) == _tunables(mine)
    monkeypatch.setenv("GRAPHRT_CACHE", "0")  # NOTE: the cache switch turns the user cache off
    switches.forget()
    assert tuning.cache_path(H100) is None
    assert tuning.choose(H100).path == str(tuning.COMMITTED / "NVIDIA_H100_80GB_HBM3.json")


def test_a_table_survives_its_file() -> None:
    table = replace(
        tuning.DEFAULT,
        prologue_tiles=(ShapeTile(1, 6144, 4096, Tile(16, 1024, 8)),),
        prologue_norm_tile=None,
        sampler_layouts=(SamplerRule(1000, 128, 4, 8, 2, 4),),
    )
    back = tuning.parse(json.loads(json.dumps(tuning.as_json(table, H100))), "x", "mem")
    assert _tunables(back) == _tunables(table) and back.source == table.source


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda d: d["skinny_rules"][0]["tile"].update(block_n=3),
            r"field skinny_rules\[0\]\.tile: Tile\.block_n",
        ),
        (lambda d: d.pop("decode_waves"), "field decode_waves is missing"),
        (lambda d: d["moe"].update(warps="8"), r"field moe\.warps: expected an integer, got '8'"),
        (lambda d: d.update(format=7), "field format is 7"),
        (lambda d: d.update(tiles=[]), "unknown field tiles"),
        (lambda d: d["skinny_overrides"][0].pop("k"), r"field skinny_overrides\[0\]\.k: missing"),
        (lambda d: d.update(decode_warps={"x": 4}), "field decode_warps: expected an object head dim"),
        (lambda d: d.update(decode_warps={"128": 6}), r"decode_warps\[128\] must be a power of two"),
        (lambda d: d["sampler_layouts"][0].update(chunk=3000), r"sampler_layouts\[0\]: SamplerRule\.chunk"),
        (lambda d: d.update(decode_waves=0), "decode_waves 0 must be >= 1"),
    ],
)
def test_malformed_tables_are_refused_naming_file_and_field(cache: Path, edit, message: str) -> None:
    doc = tuning.as_json(tuning.DEFAULT, H100)
    edit(doc)
    path = cache / "NVIDIA_H100_80GB_HBM3.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(doc))
    with pytest.raises(TableError, match=message) as err:
        tuning.choose(H100)  # NOTE: refused, never skipped for the committed table
    assert str(path) in str(err.value)
    path.write_text("{not json")
    with pytest.raises(TableError, match=f"tuning table {path}: not JSON"):
        tuning.choose(H100)


def test_tiles_round_to_powers_of_two() -> None:
    assert [tuning.pow2(n) for n in (0, 1, 2, 3, 16, 17, 1000)] == [1, 1, 2, 4, 16, 32, 1024]
    # NOTE: one row is a GEMV (BLOCK_M 1); more rows take a tl.dot tile of at least 16
    assert [skinny.block_m(m) for m in (1, 2, 16, 17, 64)] == [1, 16, 16, 32, 64]


def test_the_launch_helpers_read_the_installed_table(monkeypatch: pytest.MonkeyPatch) -> None:
    assert skinny.tile_for(1, 4096, 4096) == Tile(8, 2048, 8)  # today's rule
    rule, over = Tile(32, 256, 4), Tile(16, 512, 8)
    patch_tuning(
        monkeypatch,
        skinny_rules=(SkinnyRule(64, 1 << 62, rule),),
        skinny_overrides=(ShapeTile(1, 2048, 8192, over),),
        prologue_norm_tile=Tile(4, 1024, 4),
        prologue_tiles=(ShapeTile(1, 512, 256, Tile(16, 256, 8)),),
        decode_waves=1,
        sampler_layouts=(SamplerRule(1000, 256, 4, 8, 2),),
        moe_skinny_slots=5,
    )
    assert skinny.tile_for(1, 4096, 4096) == rule and skinny.tile_for(16, 4096, 4096) == rule
    assert skinny.tile_for(1, 2048, 8192) == over and skinny.tile_for(2, 2048, 8192) == rule
    assert prologue.tile_for(4096, 4096, norm=True) == Tile(4, 1024, 4)
    assert prologue.tile_for(4096, 4096, norm=False) == rule  # SiLU: the skinny rule
    assert prologue.tile_for(512, 256, norm=False) == Tile(16, 256, 8)
    assert dk.num_splits(1, 8, 8192, 132) == 17  # one wave of 132 SMs (two: 33)
    assert sampler_launch.layout_for(600) == sampler_launch.Layout(256, 4, 8, 2)
    assert te.max_skinny_slots() == 5


@pytest.mark.parametrize("device", triton_devices())
def test_the_skinny_kernel_launches_with_the_tables_tile(
    device: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel runs with the installed table's tile (``BLOCK_N``, ``BLOCK_K``, warps) and
    still computes ``x @ W^T``."""
    if device.type == "cpu":
        monkeypatch.setenv(skinny.ENV, "interpret")
    tile = Tile(block_n=16, block_k=32, warps=2)
    patch_tuning(monkeypatch, skinny_rules=(SkinnyRule(64, 1 << 62, tile),), skinny_overrides=())
    launches, kernel = [], skinny._skinny

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launches.append((grid, kwargs["BLOCK_N"], kwargs["BLOCK_K"], kwargs["num_warps"]))
                return kernel[grid](*args, **kwargs)

            return launch

    monkeypatch.setattr(skinny, "_skinny", Spy())
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(1, 64, generator=gen), torch.randn(48, 64, generator=gen)
    x, w = x.to(device, torch.bfloat16), w.to(device, torch.bfloat16)
    y = skinny.skinny_linear(x, w, pdl=False)
    assert launches == [((3, 1), 16, 32, 2)]  # 48 rows of W in 3 programs of 16
    torch.testing.assert_close(y.float(), x.float() @ w.float().t(), atol=2e-2, rtol=2e-2)


def test_the_capture_report_and_inspect_name_the_table(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from graphrt.debug.snapshot import take_snapshot
    from graphrt.tools.inspection import report
    from tests.support.util import build_runtime

    table = patch_tuning(monkeypatch, decode_waves=3)
    setup = build_runtime(torch.device("cpu"), capture=False, buckets=(1,))
    assert setup.runtime.tuning is table and tuning.active() is table
    captured = setup.runtime.capture()
    assert captured.tuning == {"name": "test", "path": "test"}
    assert "tuning table test (test)" in str(captured)
    snap = take_snapshot(setup.runtime, tmp_path / "snap.json")
    assert snap.tuning == {"name": "test", "path": "test"}
    assert ("tuning table", "test (test)") in report.header_rows(snap)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_tune_refuses_without_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune"]) == 2
    err = capsys.readouterr().err
    assert "graphrt tune: error:" in err and "needs a CUDA device" in err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
def test_tune_writes_a_table_the_next_runtime_reads(cache: Path) -> None:
    """A tiny sweep (GEMMs only, the 1B shapes shrunk 16 times, 3 replays) writes the user
    cache; choosing the GPU's table then reads it. (``graphrt tune`` in full sweeps the split
    decode too: a few minutes, docs/gpu.md.)"""
    args = ["tune", "--models", "llama-3.2-1b", "--shrink", "16", "--iters", "3", "--classes", "1,16"]
    args += ["--only", "skinny,prologue"]
    assert main(args) == 0
    name = torch.cuda.get_device_name(0)
    path = tuning.cache_path(name)
    assert path is not None and path.is_file() and path.with_suffix(".sweep.json").is_file()
    table = tuning.choose(name)
    assert table.path == str(path) and table.name == tuning.device_key(name)
    assert [r.max_m for r in table.skinny_rules] == [1, 16, 64]
    assert "graphrt tune on" in dict(table.source)["skinny"]
    assert (
        "graphrt tune on" in dict(table.source)["prologue"]
        and table.decode_warps == tuning.DEFAULT.decode_warps
    )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
def test_tune_moe_writes_expert_tiles_the_next_runtime_reads(cache: Path) -> None:
    """The MoE part alone (Qwen3-30B-A3B's and gpt-oss-20b's experts shrunk 16 times, 3 replays):
    every candidate checked against the reference, the swept tiles written to the user cache and
    read back by the next choice of this GPU's table; the other groups carried over."""
    from graphrt.tools.bench import tune_moe

    args = [
        "tune",
        "--models",
        "qwen3-30b-a3b,gpt-oss-20b",
        "--shrink",
        "16",
        "--iters",
        "3",
        "--only",
        "moe",
    ]
    name = torch.cuda.get_device_name(0)
    base = tuning.choose(name)
    assert main(args) == 0
    path = tuning.cache_path(name)
    table = tuning.choose(name)
    assert table.path == str(path) and "graphrt tune on" in dict(table.source)["moe"]
    assert table.moe.skinny_up() in (*tune_moe.UP, base.moe.skinny_up())
    assert table.moe.skinny_down() in (*tune_moe.DOWN, base.moe.skinny_down())
    assert replace(table, moe=base.moe, name="", path="", source=()) == replace(
        base, name="", path="", source=()
    )
    timings = json.loads(path.with_suffix(".sweep.json").read_text())["moe"]
    assert {r["model"] for r in timings} == {"qwen3-30b-a3b", "gpt-oss-20b"}
    assert all(r["us"] > 0 and r["rel_l2_vs_reference"] <= 1e-2 for r in timings)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
def test_tune_decode_sweep_checks_and_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The split decode part on one case: every candidate matches torch's attention, the pick is
    one of the candidates and other head dims keep the base table's warps."""
    from graphrt.tools.bench import tune_decode

    monkeypatch.setattr(tune_decode, "CASES", ((128, 1),))
    monkeypatch.setattr(tune_decode, "WARPS", {128: (4, 8)})
    monkeypatch.setattr(tune_decode, "WAVES", (1, 2))
    us = tune_decode.sweep(tuning.DEFAULT, 3, torch.device("cuda"))
    assert sorted(us) == [(128, 1, w, v) for w in (4, 8) for v in (1, 2)] and all(t > 0 for t in us.values())
    warps, waves = tune_decode.pick(us, tuning.DEFAULT)
    assert waves in (1, 2) and dict(warps)[128] in (4, 8) and dict(warps)[64] == 4

"""``graphrt tune``: sweep the kernels' tiles on this GPU and write its tuning table.

Starts from the table the GPU would run with now (:func:`graphrt.kernels.tuning.choose`: the
cache, the committed table or the defaults), sweeps the skinny GEMM's tiles per ``M`` class, the
fused prologues' tiles and the split decode attention's warps and waves
(:mod:`graphrt.tools.bench.tune_gemm`, :mod:`graphrt.tools.bench.tune_decode`) on the weights of
``--models`` (:mod:`graphrt.tools.bench.tune_shapes`: dense or MoE presets), and, when a MoE preset
is given, the expert kernels' tiles (:mod:`graphrt.tools.bench.tune_moe`); every candidate's
output is checked against torch's. It writes the winners as a table (the sampler's layouts
carried over: ``graphrt bench sampler --sweep`` measures those) to the user cache
``$XDG_CACHE_HOME/graphrt/tuning/<device>.json`` or ``--out``. The next runtime built on this GPU
reads it. A record of every timing goes beside it (``<out>.sweep.json``).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import torch
from rich.table import Table

from graphrt.kernels import tuning
from graphrt.tools.bench import gemm_prologue, tune_decode, tune_gemm, tune_moe, tune_shapes
from graphrt.tools.bench.tune_shapes import shapes
from graphrt.tools.cli.args import UsageError, resolve_device
from graphrt.tools.cli.console import wide_console
from graphrt.tools.cli.tune_flags import PARTS


def _cuda_device(value: str) -> torch.device:
    """The CUDA device to tune; ``UsageError`` saying that tuning needs one otherwise."""
    if not torch.cuda.is_available():
        raise UsageError(
            "--device", value, "cannot be tuned: graphrt tune needs a CUDA device (none is visible)"
        )
    device = resolve_device(value)
    if device.type != "cuda":
        raise UsageError("--device", value, "is not a CUDA device: graphrt tune needs a CUDA device")
    return device


def parts(args: argparse.Namespace) -> tuple[str, ...]:
    """The parts to sweep: ``--only``'s, else every part (``moe`` only when a MoE preset is given)."""
    has_moe = bool(tune_shapes.moe_models(args.models))
    chosen = tuple(args.only) if args.only else tuple(p for p in PARTS if p != "moe" or has_moe)
    unknown = sorted(set(chosen) - set(PARTS))
    if unknown:
        raise UsageError("--only", ",".join(chosen), f"names no part: choose among {', '.join(PARTS)}")
    if "moe" in chosen and not has_moe:
        raise UsageError(
            "--models", ",".join(args.models), "has no MoE preset: --only moe sweeps MoE presets' experts"
        )
    return chosen


def tune(
    args: argparse.Namespace, device: torch.device, base: tuning.TuningTable
) -> tuple[tuning.TuningTable, dict]:
    """The swept table (``base`` where a part is not swept) and the raw timings."""
    chosen, found, raw = parts(args), {}, {}
    sizes, models = tuple(sorted(set(args.classes))), shapes(args.models, args.shrink)
    stamp = (
        f"graphrt tune on {torch.cuda.get_device_name(device)}, {time.strftime('%Y-%m-%d', time.gmtime())}"
    )
    sweep = f"{stamp}: {', '.join(args.models)} projections, {args.iters} replays"
    source = dict(base.source)
    with tuning.using(base):
        if "skinny" in chosen and models:
            t = tune_gemm.sweep_skinny(models, sizes, args.iters, device)
            rules, overrides = tune_gemm.pick_skinny(t, models, sizes, base)
            found |= {"skinny_rules": rules, "skinny_overrides": overrides}
            source["skinny"], raw["skinny"] = f"{sweep}, M classes {list(sizes)}", t.rows
        table = replace(base, **found)
        has_norm = any(gemm_prologue.KERNEL.get(s[1]) == "norm" for s in models)
        if "prologue" in chosen and has_norm and tune_gemm.prologue_on(device):
            extra = tuple({table.skinny_tile(1, 1, s[3], s[2]) for s in models})  # NOTE: SiLU's own tiles
            t = tune_gemm.sweep_prologue(models, args.iters, device, extra)
            norm, tiles = tune_gemm.pick_prologue(t, models, lambda n, k: table.skinny_tile(1, 1, n, k))
            found |= {"prologue_norm_tile": norm, "prologue_tiles": tiles}
            source["prologue"], raw["prologue"] = sweep, t.rows
        if "decode" in chosen:
            us = tune_decode.sweep(base, args.iters, device)
            warps, waves = tune_decode.pick(us, base)
            found |= {"decode_warps": warps, "decode_waves": waves}
            source["decode"] = f"{stamp}: cases {list(tune_decode.CASES)}, {tune_decode.CONTEXT} keys"
            raw["decode"] = [{"case": list(k), "us": v} for k, v in us.items()]
        if "moe" in chosen:
            start = time.perf_counter()
            found["moe"], raw["moe"] = _tune_moe(args, device, base)
            raw["moe_seconds"] = time.perf_counter() - start  # NOTE: the part's share of the budget
            source["moe"] = (
                f"{stamp}: {', '.join(tune_shapes.moe_models(args.models))} experts, skinny T="
                f"{tune_moe.SKINNY_T}, grouped T={list(tune_moe.GROUPED_T)}, {args.iters} replays"
            )
    for part in ("sampler", "moe"):  # NOTE: the sampler (and MoE tiles without a MoE preset) carried
        kept = source.get(part, "")
        if part not in found and not kept.startswith("not swept"):
            source[part] = f"not swept by graphrt tune: {kept}"
    name = tuning.device_key(torch.cuda.get_device_name(device))
    return replace(base, name=name, source=tuple(source.items()), **found), raw


def _tune_moe(
    args: argparse.Namespace, device: torch.device, base: tuning.TuningTable
) -> tuple[tuning.MoeTiles, list[dict]]:
    """The MoE part: the experts of every MoE preset of ``--models`` (shrunk ``--shrink`` times)."""
    experts = [(m, tune_shapes.expert_shape(m)) for m in tune_shapes.moe_models(args.models)]
    skinny, grouped = tune_moe.cases(experts)
    bench = tune_moe.Bench(base, args.iters, device, args.shrink)
    try:
        tiles = tune_moe.search(bench, skinny, grouped, base.moe)
    finally:
        bench.release()
    return tiles, bench.rows


def run_tune(args: argparse.Namespace) -> int:
    """``graphrt tune``: sweep, write the table (and its timings beside it), print what changed."""
    device = _cuda_device(args.device)
    name = torch.cuda.get_device_name(device)
    base = tuning.choose(name)
    out = Path(args.out) if args.out else tuning.cache_path(name)
    if out is None:
        raise UsageError("--out", None, "is needed: the user cache is off (GRAPHRT_CACHE=0) or has no home")
    start = time.perf_counter()
    for note in tune_shapes.notes(args.models):
        wide_console().print(note)
    with torch.no_grad():
        table, raw = tune(args, device, base)
    table = replace(table, path=str(out))
    tuning.write(table, name, out)
    rows = {
        part: [_plain(r) for r in rs] if part in ("skinny", "prologue") else rs for part, rs in raw.items()
    }
    out.with_suffix(".sweep.json").write_text(json.dumps({"device": name, "base": base.brief(), **rows}))
    print_summary(base, table, out, time.perf_counter() - start)
    return 0


def _plain(row: dict) -> dict:
    return {k: (str(v) if k in ("tile", "shape") else v) for k, v in row.items()}


def _short(value: object) -> str:
    """A tunable in a few characters: ``8x2048 w8 s1`` tiles, ``M<=16: tile`` rules."""
    if isinstance(value, tuning.Tile):
        return f"{value.block_n}x{value.block_k} w{value.warps} s{value.stages}"
    if isinstance(value, tuning.MoeTiles):
        (un, uk, uw), (dn, dk, dw) = value.skinny_up(), value.skinny_down()
        grouped = f"{value.block_n}x{value.block_k} w{value.warps} s{value.stages}"
        down = f"{dn}x{dk} w{dw} in {value.skinny_down_split}"
        return f"skinny up {un}x{uk} w{uw}, down {down}; grouped {grouped}"
    if isinstance(value, tuning.SkinnyRule):
        return f"M<={value.max_m}: {_short(value.tile)}"
    if isinstance(value, tuning.ShapeTile):
        return f"M{value.m_class} N={value.n} K={value.k}: {_short(value.tile)}"
    if isinstance(value, tuple) and value and not isinstance(value[0], int):
        return "; ".join(_short(v) for v in value)
    return "—" if value == () else str(value)


def print_summary(base: tuning.TuningTable, table: tuning.TuningTable, out: Path, seconds: float) -> None:
    """Each tunable before (``base``) and after the sweep."""
    grid = Table(title=f"graphrt tune — {table.name} (from {base.name}: {base.path})")
    for col in ("tunable", "before", "after"):
        grid.add_column(col, no_wrap=False)
    for field in tuning.files.PARSERS:
        if field == "source":
            continue
        before, after = getattr(base, field), getattr(table, field)
        grid.add_row(field, _short(before), _short(after) if after != before else "same")
    console = wide_console()
    console.print(grid)
    console.print(f"{seconds:.0f} s; written to {out} (timings in {out.with_suffix('.sweep.json')})")

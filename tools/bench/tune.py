"""``graphrt tune``: sweep the kernels' tiles on this GPU and write its tuning table.

Starts from the table the GPU would run with now (:func:`graphrt.kernels.tuning.choose`: the
cache, the committed table or the defaults), sweeps the skinny GEMM's tiles per ``M`` class, the
fused prologues' tiles and the split decode attention's warps and waves
(:mod:`graphrt.tools.bench.tune_gemm`, :mod:`graphrt.tools.bench.tune_decode`; every candidate's
output checked against torch's), and writes the winners as a table (the sampler's layouts and
the MoE tiles carried over: ``graphrt bench sampler --sweep`` and ``bench moe`` measure those)
to the user cache ``$XDG_CACHE_HOME/graphrt/tuning/<device>.json`` or ``--out``. The next runtime
built on this GPU reads it. A record of every timing goes beside it (``<out>.sweep.json``).
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
from graphrt.models.presets import LlamaConfig, preset
from graphrt.tools.bench import gemm, tune_decode, tune_gemm
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


def shapes(models: list[str], shrink: int = 1) -> list[tune_gemm.Shape]:
    """``(model, projection, K, N)`` of every weight of ``models`` (shrunk ``shrink`` times)."""
    out = []
    for model in models:
        cfg = preset(model)
        if not isinstance(cfg, LlamaConfig):
            raise UsageError("--models", model, "is not a dense Llama-style preset")
        out += [(model, name, k // shrink, n // shrink) for name, k, n in gemm.projections(cfg)]
    return out


def tune(
    args: argparse.Namespace, device: torch.device, base: tuning.TuningTable
) -> tuple[tuning.TuningTable, dict]:
    """The swept table (``base`` where a part is not swept) and the raw timings."""
    parts, found, raw = args.only or PARTS, {}, {}
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise UsageError("--only", ",".join(parts), f"names no part: choose among {', '.join(PARTS)}")
    sizes, models = tuple(sorted(set(args.classes))), shapes(args.models, args.shrink)
    stamp = (
        f"graphrt tune on {torch.cuda.get_device_name(device)}, {time.strftime('%Y-%m-%d', time.gmtime())}"
    )
    sweep = f"{stamp}: {', '.join(args.models)} projections, {args.iters} replays"
    source = dict(base.source)
    with tuning.using(base):
        if "skinny" in parts:
            t = tune_gemm.sweep_skinny(models, sizes, args.iters, device)
            rules, overrides = tune_gemm.pick_skinny(t, models, sizes, base)
            found |= {"skinny_rules": rules, "skinny_overrides": overrides}
            source["skinny"], raw["skinny"] = f"{sweep}, M classes {list(sizes)}", t.rows
        table = replace(base, **found)
        if "prologue" in parts and tune_gemm.prologue_on(device):
            extra = tuple({table.skinny_tile(1, 1, s[3], s[2]) for s in models})  # NOTE: SiLU's own tiles
            t = tune_gemm.sweep_prologue(models, args.iters, device, extra)
            norm, tiles = tune_gemm.pick_prologue(t, models, lambda n, k: table.skinny_tile(1, 1, n, k))
            found |= {"prologue_norm_tile": norm, "prologue_tiles": tiles}
            source["prologue"], raw["prologue"] = sweep, t.rows
        if "decode" in parts:
            us = tune_decode.sweep(base, args.iters, device)
            warps, waves = tune_decode.pick(us, base)
            found |= {"decode_warps": warps, "decode_waves": waves}
            source["decode"] = f"{stamp}: cases {list(tune_decode.CASES)}, {tune_decode.CONTEXT} keys"
            raw["decode"] = [{"case": list(k), "us": v} for k, v in us.items()]
    for part in ("sampler", "moe"):  # NOTE: measured by bench sampler --sweep / bench moe, not here
        kept = source.get(part, "")
        source[part] = kept if kept.startswith("not swept") else f"not swept by graphrt tune: {kept}"
    name = tuning.device_key(torch.cuda.get_device_name(device))
    return replace(base, name=name, source=tuple(source.items()), **found), raw


def run_tune(args: argparse.Namespace) -> int:
    """``graphrt tune``: sweep, write the table (and its timings beside it), print what changed."""
    device = _cuda_device(args.device)
    name = torch.cuda.get_device_name(device)
    base = tuning.choose(name)
    out = Path(args.out) if args.out else tuning.cache_path(name)
    if out is None:
        raise UsageError("--out", None, "is needed: the user cache is off (GRAPHRT_CACHE=0) or has no home")
    start = time.perf_counter()
    with torch.no_grad():
        table, raw = tune(args, device, base)
    table = replace(table, path=str(out))
    tuning.write(table, name, out)
    rows = {part: [_plain(r) for r in rs] if part != "decode" else rs for part, rs in raw.items()}
    out.with_suffix(".sweep.json").write_text(json.dumps({"device": name, "base": base.brief(), **rows}))
    print_summary(base, table, out, time.perf_counter() - start)
    return 0


def _plain(row: dict) -> dict:
    return {k: (str(v) if k in ("tile", "shape") else v) for k, v in row.items()}


def _short(value: object) -> str:
    """A tunable in a few characters: ``8x2048 w8 s1`` tiles, ``M<=16: tile`` rules."""
    if isinstance(value, tuning.Tile):
        return f"{value.block_n}x{value.block_k} w{value.warps} s{value.stages}"
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

"""``graphrt tune``'s flags: what to sweep on this GPU and where the table goes."""

from __future__ import annotations

import argparse

from graphrt.kernels.skinny import M_CLASSES
from graphrt.tools.cli.args import AUTO, batch_sizes, device_name, positive_int

#: Presets whose projections the GEMM sweeps time by default (dense; MoE presets such as
#: ``qwen3-30b-a3b`` or ``gpt-oss-20b`` add their projections and the ``moe`` part).
MODELS = ("llama-3.2-1b", "llama-3-8b")
PARTS = ("skinny", "prologue", "decode", "moe")


def m_classes(text: str) -> tuple[int, ...]:
    """Comma-separated ``M`` classes of the skinny GEMM's table, each one of ``M_CLASSES``."""
    sizes = batch_sizes(text)
    bad = [m for m in sizes if m not in M_CLASSES]
    if bad:
        raise argparse.ArgumentTypeError(f"M classes must be among {M_CLASSES}, got {text!r}")
    return sizes


def models(text: str) -> list[str]:
    """Comma-separated model presets (dense Llama-style, or MoE: ``graphrt.models.moe_presets``)."""
    names = [m.strip() for m in text.split(",") if m.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"no model preset in {text!r}")
    return names


def add_tune(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """``graphrt tune``: sweep the kernels' tiles on a CUDA device, write its tuning table."""
    p = sub.add_parser(
        "tune",
        parents=[common],
        help="sweep the kernels' tiles on this GPU and write its tuning table (needs a CUDA device)",
    )
    p.add_argument(
        "--device", type=device_name, default=AUTO, help="the CUDA device to tune (auto, cuda[:N])"
    )
    p.add_argument(
        "--models",
        type=models,
        default=",".join(MODELS),
        help="presets whose projections (and MoE experts) are timed, e.g. llama-3-8b,qwen3-30b-a3b,gpt-oss-20b",
    )
    p.add_argument("--classes", type=m_classes, default="1,16,64", help="skinny GEMM M classes to sweep")
    p.add_argument(
        "--only",
        type=lambda t: t.split(","),
        default=None,
        help=f"parts to sweep (of {','.join(PARTS)}; moe only with a MoE preset, by default then)",
    )
    p.add_argument("--iters", type=positive_int, default=100, help="graph replays per candidate")
    p.add_argument(
        "--shrink", type=positive_int, default=1, help="divide every GEMM shape by this (quick runs)"
    )
    p.add_argument(
        "--out",
        default=None,
        help="table file (default: the user cache $XDG_CACHE_HOME/graphrt/tuning/<device>.json)",
    )

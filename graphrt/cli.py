"""``graphrt demo`` and ``graphrt bench``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="graphrt", description="LLM decode as CUDA-graph replays")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="generate with graphs and eagerly; compare tokens and speed")
    demo.add_argument("--model", default="tiny-llama")
    demo.add_argument("--device", default=None)
    demo.add_argument("--prompts", type=int, default=16)
    demo.add_argument("--max-new-tokens", type=int, default=32)
    demo.add_argument("--max-batch-size", type=int, default=32)
    demo.add_argument("--page-size", type=int, default=16)
    demo.add_argument("--max-context-len", type=int, default=512)
    demo.add_argument("--backend", default=None, help="fa3 | reference (default: best available)")
    bench = sub.add_parser("bench", help="decode step time eager vs graph; JSON under bench/results/")
    bench.add_argument("--device", default=None)
    bench.add_argument("--batch-sizes", default="1,8,64")
    bench.add_argument("--context", type=int, default=512, help="KV length of every request")
    bench.add_argument("--iters", type=int, default=50)
    bench.add_argument("--backend", default=None)
    bench.add_argument("--out", default="bench/results")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from graphrt.tools.demo import run_demo

        return run_demo(args)
    from graphrt.tools.bench import run_bench

    return run_bench(args)

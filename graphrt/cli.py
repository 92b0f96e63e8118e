"""``graphrt demo``, ``bench``, ``inspect`` and ``debug``; the implementations live in tools/."""

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
    demo.add_argument("--snapshot", default=None, metavar="PATH", help="write a debug snapshot (JSON + .npz)")
    bench = sub.add_parser(
        "bench", help="decode step time eager vs graph (or 'bench host': host cost per step vs a peer)"
    )
    bench.add_argument("what", nargs="?", default="decode", choices=("decode", "host"))
    bench.add_argument("--device", default=None)
    bench.add_argument("--batch-sizes", default=None, help="default 1,8,64 (host: 1,8,64,256)")
    bench.add_argument(
        "--modes", default=None, help="host: decode,verify-chain,verify-tree,draft-decode,draft-extend"
    )
    bench.add_argument("--page-sizes", default="1,16", help="host only")
    bench.add_argument("--context-lens", default="4096,131072", help="host only: max_context_len values")
    bench.add_argument("--real-len", type=int, default=512, help="host only: tokens each request holds")
    bench.add_argument("--smoke", action="store_true", help="host only: tiny sizes (CI)")
    bench.add_argument("--context", type=int, default=512, help="KV length of every request")
    bench.add_argument("--iters", type=int, default=50)
    bench.add_argument("--backend", default=None)
    bench.add_argument("--out", default="bench/results")
    spec = sub.add_parser(
        "bench-spec", help="verify / draft step times eager vs graph; JSON under bench/results/"
    )
    spec.add_argument("--device", default=None)
    spec.add_argument("--batch-sizes", default="1,8,32")
    spec.add_argument("--context", type=int, default=512, help="KV length of every request")
    spec.add_argument("--iters", type=int, default=30)
    spec.add_argument("--backend", default=None)
    spec.add_argument("--out", default="bench/results")
    inspect = sub.add_parser("inspect", help="a snapshot's facts as tables on stdout")
    inspect.add_argument("path")
    inspect.add_argument("--width", type=int, default=None, help="console width (default: terminal)")
    inspect.add_argument("--no-kernels", action="store_true", help="skip the per-graph kernel tables")
    inspect.add_argument("--all-graphs", action="store_true", help="kernel tables for every bucket")
    debug = sub.add_parser("debug", help="graph-debug TUI over a snapshot (or a fresh CPU demo run)")
    debug.add_argument("path", nargs="?", default=None)
    debug.add_argument("--screenshots", default=None, metavar="DIR", help="save one SVG per view and exit")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from graphrt.tools.demo import run_demo

        return run_demo(args)
    if args.command == "inspect":
        from graphrt.tools.inspect import run_inspect

        return run_inspect(args)
    if args.command == "debug":  # NOTE: the only command that imports Textual
        try:
            from graphrt.tools.tui.app import run_debug
        except ImportError as err:
            parser.exit(
                2, f"graphrt debug needs Textual ({err}); pip install 'textual>=0.80' or use inspect\n"
            )
        return run_debug(args)
    if args.command == "bench-spec":
        from graphrt.tools.bench_spec import run_bench_spec

        return run_bench_spec(args)
    if args.what == "host":
        from graphrt.tools.bench_host import run_bench_host

        return run_bench_host(args)
    args.batch_sizes = args.batch_sizes or "1,8,64"
    from graphrt.tools.bench import run_bench

    return run_bench(args)

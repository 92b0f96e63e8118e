"""``graphrt demo``, ``generate``, ``bench`` (decode, host, buckets, model, overlap, gemm, sampler), ``bench-spec``, ``inspect`` and ``debug``.

The parser lives here; argument types and machine checks in ``graphrt.tools.cli.args``; each
command's implementation in ``graphrt.tools``. A bad value ends with one line on stderr that
names the flag, the value and what is allowed, and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import logging
from collections.abc import Sequence

from graphrt import __version__
from graphrt.tools.cli.args import (
    AUTO,
    LOG_LEVELS,
    Parser,
    UsageError,
    backend_names,
    batch_sizes,
    configure_logging,
    device_name,
    fail,
    kv_cache_dtypes,
    model_name,
    model_names,
    positive_int,
    token_ids,
)

log = logging.getLogger(__name__)
TUI_HINT = (
    "graphrt debug needs Textual, which the tui extra installs: pip install -e '.[tui]' in a clone "
    "(pip install 'textual>=0.80' anywhere); graphrt inspect PATH shows the same facts without it"
)

#: ``graphrt bench TARGET`` batch sizes when ``--batch-sizes`` is not given.
BENCH_SIZES = {
    "decode": "1,8,64",
    "host": "1,8,64",
    "buckets": "1,8,64",
    "model": "1,16,64",
    "gemm": "1,16,64",
    "sampler": "1,8,64",
}


def _common(log: bool = True) -> Parser:
    common = Parser(add_help=False)
    if log:
        common.add_argument(
            "--log-level", choices=LOG_LEVELS, default="warning", help="graphrt log messages shown on stderr"
        )
    return common


def _device_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--device", type=device_name, default=AUTO, help="auto (CUDA when available, else CPU), cpu, cuda[:N]"
    )
    p.add_argument(
        "--backend",
        choices=backend_names(),
        default=AUTO,
        help="attention backend; auto: FA3 when sgl_kernel imports, else the torch reference",
    )


def _add_demo(sub: argparse._SubParsersAction, common: Parser) -> None:
    p = sub.add_parser(
        "demo", parents=[common], help="generate with graphs and eagerly; compare tokens (and speed on a GPU)"
    )
    p.add_argument(
        "--model",
        type=model_name,
        default=AUTO,
        help=f"{' | '.join(model_names())} | checkpoint dir | file.gguf; auto: smollm2 when installed, else tiny-llama",
    )
    _device_args(p)
    p.add_argument("--prompts", type=positive_int, default=16, help="random prompts of 4..64 tokens (seed 0)")
    p.add_argument("--max-new-tokens", type=positive_int, default=32, help="tokens generated per prompt")
    p.add_argument(
        "--random-lengths",
        action="store_true",
        help="draw each prompt's budget from [max-new-tokens/4, max-new-tokens] (seed 0), so requests finish at different steps",
    )
    p.add_argument(
        "--max-batch-size", type=positive_int, default=32, help="running requests (largest bucket)"
    )
    p.add_argument("--page-size", type=positive_int, default=16, help="KV cache page size in tokens")
    p.add_argument("--max-context-len", type=positive_int, default=512, help="longest prompt + new tokens")
    p.add_argument("--snapshot", default=None, metavar="PATH", help="write a debug snapshot (PATH + .npz)")
    _sampling_args(p, "prompt i samples with seed + i")
    _kv_arg(p)
    _tp_arg(p)


def _kv_arg(p: argparse.ArgumentParser, scope: str = "") -> None:
    p.add_argument(
        "--kv-cache-dtype",
        choices=kv_cache_dtypes(),
        default="auto",
        help=f"{scope}KV cache: auto (the model's dtype); fp8_e4m3 (MHA/GQA: FP8, half of bf16's "
        "bytes; model: timed against bf16 KV); bf16 | fp8 (DSA presets' MLA layouts)",
    )


def _tp_arg(p: argparse.ArgumentParser, scope: str = "") -> None:
    p.add_argument(
        "--tp",
        type=positive_int,
        default=1,
        help=f"{scope}tensor-parallel size: run under torchrun --nproc-per-node N (rank 0 prints)",
    )


def _sampling_args(p: argparse.ArgumentParser, seed_help: str) -> None:
    """``--temperature --top-k --top-p --seed``: a ``SamplingParams`` (checked when built)."""
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy; > 0 samples inside the graph")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0: all)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus mass in (0, 1] (1: all)")
    p.add_argument("--seed", type=int, default=0, help=seed_help)


def _add_generate(sub: argparse._SubParsersAction, common: Parser) -> None:
    p = sub.add_parser(
        "generate", parents=[common], help="stream a model's reply (chat template) with graphs"
    )
    p.add_argument(
        "--model", type=model_name, default="smollm2", help="smollm2 | checkpoint dir | file.gguf | preset"
    )
    text = p.add_mutually_exclusive_group(required=True)
    text.add_argument("--prompt", default=None, help="the user's message, through the model's chat template")
    text.add_argument("--prompt-ids", type=token_ids, default=None, help="comma-separated token ids instead")
    p.add_argument("--max-new-tokens", type=positive_int, default=64, help="tokens generated at most")
    p.add_argument("--max-context-len", type=positive_int, default=1024, help="prompt + new tokens at most")
    p.add_argument(
        "--device", type=device_name, default=AUTO, help="auto (CUDA when available, else CPU), cpu, cuda[:N]"
    )
    p.add_argument("--json", action="store_true", help='print {"prompt_ids", "output_ids", "text"} only')
    _sampling_args(p, "the request's random stream (same seed, same text)")
    _kv_arg(p)
    _tp_arg(p)


def _add_host_args(p: argparse.ArgumentParser) -> None:
    """``graphrt bench host``: a step's host cost split by phase, against an SGLang-style peer."""
    p.add_argument(
        "what",
        nargs="?",
        default="decode",
        choices=("decode", "host", "buckets", "model", "overlap", "gemm", "sampler"),
        help="decode: step time; host: host cost; buckets: padded tokens, default vs suggested ladder; "
        "model: a whole model's step vs the weight-read floor and transformers; "
        "overlap: engine step wall time vs GPU busy time and replay gaps, overlap off vs on; "
        "gemm: decode-shaped projections in a graph, cuBLAS vs the skinny kernel vs the floor "
        "(--batch-sizes: rows M); sampler: the in-graph sampler per call, torch vs the fused kernel vs floors",
    )
    p.add_argument("--sweep", action="store_true", help="gemm only: also time candidate tiles (with PDL)")
    p.add_argument(
        "--modes", default=None, help="host: decode,verify-chain,verify-tree,draft-decode,draft-extend (all)"
    )
    p.add_argument("--page-sizes", default="1,16", help="host only: comma-separated page sizes")
    p.add_argument("--context-lens", default="4096,131072", help="host only: max_context_len values")
    p.add_argument("--real-len", type=positive_int, default=512, help="host only: tokens each request holds")
    p.add_argument("--smoke", action="store_true", help="host only: tiny sizes (CI)")
    p.add_argument(
        "--engine-model",
        default="tiny-llama",
        help="overlap only: the engines' model (preset, checkpoint dir, .gguf, smollm2)",
    )
    p.add_argument("--sampled", action="store_true", help="overlap only: top-p 0.9 draws instead of greedy")
    p.add_argument(
        "--profile",
        action="store_true",
        help="host only: time each phase of run() (replay stubbed), first page size and context",
    )
    p.add_argument(
        "--profile-top", type=int, default=0, help="host --profile: also print cProfile's top N functions"
    )
    _add_buckets_args(p)


def _add_buckets_args(p: argparse.ArgumentParser) -> None:
    """``graphrt bench buckets``: the ladder the workload picks vs the default one."""
    p.add_argument(
        "--trace",
        default=None,
        metavar="FILE",
        help='buckets only: .jsonl, one bs per line (an int or {"bs": N}); default: a generated trace',
    )
    p.add_argument(
        "--max-graphs",
        type=positive_int,
        default=None,
        help="buckets only: graphs the suggested ladder may use (default: as many as the default ladder)",
    )
    p.add_argument(
        "--max-batch-size",
        type=positive_int,
        default=256,
        help="buckets only: the allocation (largest bucket)",
    )
    p.add_argument(
        "--steps", type=positive_int, default=20000, help="buckets only: steps of a generated trace"
    )
    p.add_argument(
        "--mean-bs",
        type=positive_int,
        default=40,
        help="buckets only: mean running requests of a generated trace",
    )
    p.add_argument("--seed", type=int, default=0, help="buckets only: seed of a generated trace")


def _add_model_args(p: argparse.ArgumentParser) -> None:
    """``graphrt bench model``: graphrt vs the weight-read floor vs transformers (eager, compiled)."""
    p.add_argument(
        "--shape",
        default=None,
        help="model only: a Llama preset (random weights); default llama-3-8b on CUDA, tiny-llama on CPU",
    )
    p.add_argument(
        "--no-compile",
        action="store_true",
        help="model only: skip torch.compile of transformers (minutes at 8B)",
    )
    p.add_argument(
        "--compile-budget",
        type=float,
        default=330.0,
        help="model only: seconds of torch.compile; a batch size whose compile would overrun it is skipped",
    )
    p.add_argument(
        "--parity-tol",
        type=float,
        default=None,
        help="model only: relative L2 logit error allowed (default: 5e-2 bf16, 1e-3 fp32)",
    )
    p.add_argument(
        "--vocabs", type=batch_sizes, default="49152,128256", help="sampler only: vocabulary sizes"
    )


def _add_bench(sub: argparse._SubParsersAction, common: Parser, name: str, sizes: str, iters: int) -> None:
    what = "decode" if name == "bench" else "verify / draft decode / draft extend"
    p = sub.add_parser(name, parents=[common], help=f"{what} step time, eager vs graph; JSON under --out")
    if name == "bench":
        _add_host_args(p)
        _add_model_args(p)
    _device_args(p)
    p.add_argument(
        "--batch-sizes",
        type=batch_sizes,
        default=None if name == "bench" else sizes,
        help="comma-separated batch sizes"
        + (f" (default {sizes}; model: 1,16,64)" if name == "bench" else ""),
    )
    p.add_argument("--context", type=positive_int, default=512, help="KV length of every request")
    p.add_argument("--iters", type=positive_int, default=iters, help="timed steps per measurement")
    if name == "bench":
        _kv_arg(p, "decode and model: ")
    if name == "bench-spec":
        _add_spec_engine_args(p)
    _tp_arg(p, "decode only: " if name == "bench" else "")
    p.add_argument(
        "--out",
        default="bench/results",
        metavar="DIR",
        help="results directory (created; a new file per run)",
    )


def _add_spec_engine_args(p: argparse.ArgumentParser) -> None:
    """``bench-spec --target``: the speculative engine end to end (acceptance, tokens == greedy)."""
    p.add_argument("--target", help="run the engine on this model (preset, checkpoint, .gguf, smollm2)")
    p.add_argument("--draft", help="draft model (default: the target drafting for itself)")
    p.add_argument("--topk", type=batch_sizes, default="1,2,4", help="comma-separated draft branch counts")
    p.add_argument("--num-steps", type=positive_int, default=3, help="draft steps per round")
    p.add_argument("--max-new-tokens", type=positive_int, default=64, help="tokens per prompt")
    p.add_argument("--prompt-len", type=positive_int, default=32, help="random prompt length")
    p.add_argument(
        "--dtype",
        choices=("auto", "bf16", "fp32"),
        default="auto",
        help="weights and KV (auto: bf16 on CUDA); fp32 keeps near-ties from flipping tokens",
    )


def build_parser() -> Parser:
    """The ``graphrt`` parser with every sub-command."""
    parser = Parser(prog="graphrt", description="LLM decoding as replays of pre-captured CUDA graphs")
    parser.add_argument("--version", action="version", version=f"graphrt {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    common = _common()
    _add_demo(sub, common)
    _add_generate(sub, common)
    _add_bench(sub, common, "bench", BENCH_SIZES["decode"], 50)
    _add_bench(sub, common, "bench-spec", "1,8,32", 30)
    inspect = sub.add_parser("inspect", parents=[common], help="a snapshot's facts as tables on stdout")
    inspect.add_argument("path", metavar="PATH", help="snapshot JSON (its .npz beside it)")
    inspect.add_argument(
        "--width",
        type=positive_int,
        default=None,
        help="console width (default: terminal, or 140 when piped)",
    )
    inspect.add_argument("--no-kernels", action="store_true", help="skip the per-graph kernel tables")
    inspect.add_argument("--all-graphs", action="store_true", help="kernel tables for every bucket")
    inspect.add_argument(
        "--full-names", action="store_true", help="kernel names with every template argument"
    )
    debug = sub.add_parser(
        "debug", parents=[common], help="graph-debug TUI over a snapshot (needs the tui extra)"
    )
    debug.add_argument(
        "path", nargs="?", default=None, metavar="PATH", help="snapshot JSON (default: a fresh CPU demo run)"
    )
    debug.add_argument(
        "--screenshots", default=None, metavar="DIR", help="save one SVG per view into DIR and exit"
    )
    return parser


#: (command, bench target) -> the tools module and function that implement it.
COMMANDS: dict[tuple[str, str | None], tuple[str, str]] = {
    ("demo", None): ("graphrt.tools.cli.demo", "run_demo"),
    ("generate", None): ("graphrt.tools.cli.generate", "run_generate"),
    ("inspect", None): ("graphrt.tools.inspection.tables", "run_inspect"),
    ("debug", None): ("graphrt.tools.inspection.tui.app", "run_debug"),
    ("bench-spec", None): ("graphrt.tools.bench.spec", "run_bench_spec"),
    ("bench", "decode"): ("graphrt.tools.bench.decode", "run_bench"),
    ("bench", "host"): ("graphrt.tools.bench.host", "run_bench_host"),
    ("bench", "buckets"): ("graphrt.tools.bench.buckets", "run_bench_buckets"),
    ("bench", "model"): ("graphrt.tools.bench.model", "run_bench_model"),
    ("bench", "overlap"): ("graphrt.tools.bench.overlap", "run_bench_overlap"),
    ("bench", "gemm"): ("graphrt.tools.bench.gemm", "run_bench_gemm"),
    ("bench", "sampler"): ("graphrt.tools.bench.sampler", "run_bench_sampler"),
}


def _dispatch(parser: Parser, args: argparse.Namespace) -> int:
    if args.command == "demo":
        from graphrt.tools.cli.demo import demo_sampling

        try:
            args.sampling = demo_sampling(args)
        except (TypeError, ValueError) as err:
            parser.error(f"demo: {err}")
    what = getattr(args, "what", None)
    if args.command == "bench" and args.batch_sizes is None:
        args.batch_sizes = batch_sizes(BENCH_SIZES[what])
    module, name = COMMANDS[(args.command, what)]
    try:
        run = getattr(importlib.import_module(module), name)
    except ImportError:
        if args.command != "debug":  # NOTE: the only command with an optional dependency (Textual)
            raise
        return fail("graphrt debug", RuntimeError(TUI_HINT))
    return run(args)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``graphrt`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as done:  # NOTE: --help, --version and bad values; returned, not raised
        return int(done.code or 0)
    configure_logging(args.log_level)
    try:
        return _dispatch(parser, args)
    except (UsageError, ValueError) as err:
        # NOTE: ValueError: a combination of values the runtime refuses (its message says which)
        log.debug("%s failed", args.command, exc_info=True)
        return fail(f"graphrt {args.command}", err)

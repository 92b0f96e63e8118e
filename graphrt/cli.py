"""``graphrt demo``, ``generate``, ``serve``, ``bench`` (decode, host, buckets, model, overlap, gemm, moe, sampler, serve, prefix), ``bench-spec``, ``tune``, ``inspect`` and ``debug``.

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
    configure_logging,
    device_name,
    fail,
    install_hint,
    model_name,
    model_names,
    port_number,
    positive_int,
    token_ids,
)
from graphrt.tools.cli.flags import (
    BENCH_SIZES,
    add_bench,
    bench_defaults,
    capture_arg,
    deterministic_arg,
    device_args,
    kv_arg,
    quant_arg,
    sampling_args,
    tp_arg,
)
from graphrt.tools.cli.reply_flags import reply_args
from graphrt.tools.cli.serve_flags import server_args
from graphrt.tools.cli.spec_flags import speculative_arg
from graphrt.tools.cli.threads import apply_threads
from graphrt.tools.cli.tune_flags import add_tune

log = logging.getLogger(__name__)
TUI_HINT = (
    "graphrt debug needs Textual, which the tui extra installs: pip install -e '.[tui]' in a clone "
    "(pip install 'textual>=0.80' anywhere); graphrt inspect PATH shows the same facts without it"
)


def _common(log: bool = True) -> Parser:
    common = Parser(add_help=False)
    common.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        help="CPU threads for torch's ops (default: OMP_NUM_THREADS, else half the CPUs, at most 4)",
    )
    if log:
        common.add_argument(
            "--log-level", choices=LOG_LEVELS, default="warning", help="graphrt log messages shown on stderr"
        )
    return common


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
    device_args(p)
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
    sampling_args(p, "prompt i samples with seed + i")
    kv_arg(p)
    tp_arg(p)


def _add_generate(sub: argparse._SubParsersAction, common: Parser) -> None:
    p = sub.add_parser(
        "generate",
        parents=[common],
        help="stream a model's reply (chat template) with graphs, or JSONL for many prompts",
    )
    p.add_argument(
        "--model", type=model_name, default="smollm2", help="smollm2 | checkpoint dir | file.gguf | preset"
    )
    text = p.add_mutually_exclusive_group(required=True)
    text.add_argument("--prompt", default=None, help="the user's message, through the model's chat template")
    text.add_argument(
        "--prompt-ids",
        type=token_ids,
        default=None,
        help="comma-separated token ids instead (no tokenizer needed)",
    )
    text.add_argument(
        "--prompts-file",
        default=None,
        metavar="FILE",
        help='JSONL, one prompt a line ({"prompt"|"messages"|"prompt_ids", "max_new_tokens"?}); - reads stdin',
    )
    p.add_argument("--max-new-tokens", type=positive_int, default=64, help="tokens generated at most")
    p.add_argument("--max-context-len", type=positive_int, default=1024, help="prompt + new tokens at most")
    p.add_argument(
        "--max-batch-size",
        type=positive_int,
        default=None,
        help="prompts decoded together (default: all, up to 32)",
    )
    p.add_argument(
        "--device", type=device_name, default=AUTO, help="auto (CUDA when available, else CPU), cpu, cuda[:N]"
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="one JSON line per prompt (text, ids, finish_reason, token counts, ttft_s, tokens_per_s)",
    )
    reply_args(p)
    sampling_args(
        p, "the random stream of sampled requests (same seed, same text; default: random)", seed=None
    )
    speculative_arg(p)
    kv_arg(p)
    quant_arg(p)
    deterministic_arg(p)
    capture_arg(p)
    tp_arg(p)


def _add_serve(sub: argparse._SubParsersAction, common: Parser) -> None:
    p = sub.add_parser(
        "serve", parents=[common], help="an OpenAI-compatible HTTP server (needs the serve extra)"
    )
    p.add_argument(
        "--model",
        type=model_name,
        default="smollm2",
        help="smollm2 | checkpoint dir | file.gguf (with a tokenizer)",
    )
    p.add_argument(
        "--served-model-name",
        default=None,
        metavar="NAME",
        help="the model id clients send and /v1/models lists (default: --model as given)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=port_number, default=8000, help="TCP port (1 to 65535)")
    p.add_argument(
        "--device", type=device_name, default=AUTO, help="auto (CUDA when available, else CPU), cpu, cuda[:N]"
    )
    p.add_argument(
        "--max-batch-size",
        type=positive_int,
        default=None,
        help="requests decoded together (default: 32 on CUDA, 8 on CPU)",
    )
    p.add_argument(
        "--max-context-len",
        type=positive_int,
        default=None,
        help="prompt + reply tokens at most (default: 2048 on CUDA, 1024 on CPU)",
    )
    server_args(p)
    quant_arg(p)
    deterministic_arg(p)
    capture_arg(p)
    speculative_arg(p)
    p.add_argument(
        "--no-prefix-caching",
        action="store_true",
        help="prefill every prompt whole (default: reuse the cached KV pages of a shared prompt start)",
    )
    tp_arg(p)


def build_parser() -> Parser:
    """The ``graphrt`` parser with every sub-command."""
    parser = Parser(prog="graphrt", description="LLM decoding as replays of pre-captured CUDA graphs")
    parser.add_argument("--version", action="version", version=f"graphrt {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    common = _common()
    _add_demo(sub, common)
    _add_generate(sub, common)
    _add_serve(sub, common)
    add_bench(sub, common, "bench", BENCH_SIZES["decode"], 50)
    add_bench(sub, common, "bench-spec", "1,8,32", 30)
    add_tune(sub, common)
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
    ("serve", None): ("graphrt.tools.cli.serve", "run_serve"),
    ("inspect", None): ("graphrt.tools.inspection.tables", "run_inspect"),
    ("debug", None): ("graphrt.tools.inspection.tui.app", "run_debug"),
    ("bench-spec", None): ("graphrt.tools.bench.spec", "run_bench_spec"),
    ("tune", None): ("graphrt.tools.bench.tune", "run_tune"),
    ("bench", "decode"): ("graphrt.tools.bench.decode", "run_bench"),
    ("bench", "host"): ("graphrt.tools.bench.host", "run_bench_host"),
    ("bench", "buckets"): ("graphrt.tools.bench.buckets", "run_bench_buckets"),
    ("bench", "model"): ("graphrt.tools.bench.model", "run_bench_model"),
    ("bench", "overlap"): ("graphrt.tools.bench.overlap", "run_bench_overlap"),
    ("bench", "gemm"): ("graphrt.tools.bench.gemm", "run_bench_gemm"),
    ("bench", "moe"): ("graphrt.tools.bench.moe", "run_bench_moe"),
    ("bench", "sampler"): ("graphrt.tools.bench.sampler", "run_bench_sampler"),
    ("bench", "serve"): ("graphrt.tools.bench.serve", "run_bench_serve"),
    ("bench", "prefix"): ("graphrt.tools.bench.prefix", "run_bench_prefix"),
    ("bench", "first-answer"): ("graphrt.tools.bench.first_answer", "run_bench_first_answer"),
}


def _dispatch(parser: Parser, args: argparse.Namespace) -> int:
    if args.command == "demo":
        from graphrt.tools.cli.demo import demo_sampling

        try:
            args.sampling = demo_sampling(args)
        except (TypeError, ValueError) as err:
            parser.error(f"demo: {err}")
    what = getattr(args, "what", None)
    if args.command in ("bench", "bench-spec"):
        bench_defaults(args, what)
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
    apply_threads(args.threads)
    try:
        return _dispatch(parser, args)
    except ImportError as err:
        hint = install_hint(err)
        if hint is None:
            raise
        return fail(f"graphrt {args.command}", RuntimeError(hint))
    except (UsageError, ValueError) as err:
        # NOTE: ValueError: a combination of values the runtime refuses (its message says which)
        log.debug("%s failed", args.command, exc_info=True)
        return fail(f"graphrt {args.command}", err)

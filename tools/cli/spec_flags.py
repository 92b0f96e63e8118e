"""``graphrt bench-spec --target``'s flags: the speculative engine against plain decoding."""

from __future__ import annotations

import argparse

from graphrt.engine.spec_options import METHODS
from graphrt.tools.bench.spec_workloads import PROMPTS_DIR, WORKLOADS
from graphrt.tools.cli.args import batch_sizes, positive_int


def methods(text: str) -> list[str]:
    """Comma-separated speculative methods, each one of :data:`METHODS`."""
    names = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in names if m not in METHODS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"methods must be among {', '.join(METHODS)}, got {text!r}")
    return names


def spec_engine_args(p: argparse.ArgumentParser) -> None:
    """``bench-spec --target``: the speculative engine end to end, against the plain loop."""
    p.add_argument("--target", help="run the engine on this model (preset, checkpoint, .gguf, smollm2)")
    p.add_argument(
        "--method", type=methods, default="ngram,suffix", help=f"comma-separated: {', '.join(METHODS)}"
    )
    p.add_argument(
        "--workload", choices=WORKLOADS, default="copy", help="prompts (see tools/bench/spec_workloads)"
    )
    p.add_argument("--prompts-dir", default=str(PROMPTS_DIR), help="where copy.jsonl and chat.jsonl live")
    p.add_argument("--draft", help="draft_model: the draft (default: the target drafting for itself)")
    p.add_argument(
        "--topk", type=batch_sizes, default="1", help="comma-separated branch counts (suffix, draft_model)"
    )
    p.add_argument("--num-steps", type=positive_int, default=4, help="drafted tokens per branch and round")
    p.add_argument(
        "--disable-batch-size",
        type=int,
        default=0,
        help="ngram/suffix: no drafts above this many requests (0: never)",
    )
    p.add_argument(
        "--spec-overlap",
        choices=("on", "off", "both"),
        default="on",
        help="ngram/suffix chains: overlapped rounds (on, as by default), synchronous (off), or a row of each",
    )
    p.add_argument(
        "--replay-us",
        action="store_true",
        help="then one more generate per engine with a device sync after each replay: µs p50 "
        "per mode (the step's host write, its graph launch, and its replay up to the sync)",
    )
    p.add_argument("--max-new-tokens", type=positive_int, default=128, help="tokens per prompt")
    p.add_argument(
        "--repeats", type=positive_int, default=3, help="timed generates per engine (the median's tokens/s)"
    )
    p.add_argument("--prompt-len", type=positive_int, default=32, help="random / always-match prompt length")
    p.add_argument(
        "--dtype",
        choices=("auto", "bf16", "fp32"),
        default="auto",
        help="weights and KV (auto: bf16 on CUDA); fp32 keeps near-ties from flipping tokens",
    )


def speculative_options(text: str) -> dict[str, object]:
    """``--speculative``'s value as ``Engine(speculative=...)`` options (checked now, so a bad
    value is a usage error naming it)."""
    from graphrt.engine.spec_options import SpecOptions, parse_cli

    try:
        options = parse_cli(text)
        SpecOptions.parse(options)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from err
    return options


def speculative_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--speculative",
        type=speculative_options,
        default=None,
        metavar="SPEC",
        help="speculative decoding: ngram | suffix | draft_model, or key=value pairs "
        "(method=suffix,num_steps=4,topk=2,disable_batch_size=16); copy-heavy prompts gain, chat backs off",
    )

"""``graphrt serve``'s server options (what it answers, who it lets in, how it stops) and
``graphrt bench serve``'s (and ``bench first-answer``'s, which builds serve's engine cold)."""

from __future__ import annotations

import argparse
import json

from graphrt.engine.config import PREFILL_GRAPH_TOKENS
from graphrt.tools.bench.serve_bodies import body_names
from graphrt.tools.cli.args import batch_sizes, megabytes, model_name, positive_int, seconds


def server_args(p: argparse.ArgumentParser) -> None:
    """``graphrt serve``: log-probabilities, sampling extras, prefill graphs, drain, API key,
    body limit, special tokens."""
    p.add_argument(
        "--max-logprobs", type=int, default=20, metavar="N", help="top log-probabilities per token (0: none)"
    )
    p.add_argument(
        "--sampling-extras",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="penalties and response_format: per-row token counts and masks in every sampling step",
    )
    p.add_argument(
        "--drain-timeout",
        type=seconds,
        default=5.0,
        help="seconds Ctrl-C lets requests in flight finish before cancelling them",
    )
    p.add_argument(
        "--api-key",
        default=None,
        help="every /v1 request needs 'Authorization: Bearer KEY' (default: $GRAPHRT_API_KEY, else none)",
    )
    p.add_argument(
        "--max-body-mb", type=megabytes, default=None, help="largest request body in MiB (default: 4)"
    )
    p.add_argument(
        "--prefill-graph-tokens",
        type=int,
        default=PREFILL_GRAPH_TOKENS,
        metavar="N",
        help="a prefill of at most N tokens replays a graph, captured on first use (0: every prefill eager)",
    )
    p.add_argument(
        "--allow-special-tokens",
        action="store_true",
        help="let chat content hold the template's special tokens (<|im_start|>...: a user can fake a turn)",
    )


def bench_serve_args(p: argparse.ArgumentParser) -> None:
    """``graphrt bench serve``: both servers on one model, the same requests at each concurrency."""
    p.add_argument(
        "--model",
        type=model_name,
        default="smollm2",
        help="serve, prefix and first-answer: the model the servers run",
    )
    p.add_argument(
        "--concurrency",
        type=batch_sizes,
        default=None,
        help="serve only: clients in flight (default 1,8,32; CPU 1,8)",
    )
    p.add_argument(
        "--max-tokens",
        type=positive_int,
        default=None,
        help="serve: tokens a reply (default 128; CPU 8); first-answer: the answer's (default 16)",
    )
    p.add_argument(
        "--runs",
        type=positive_int,
        default=3,
        help="first-answer only: cold processes per capture policy (lazy and eager alternate)",
    )
    p.add_argument(
        "--run-timeout",
        type=seconds,
        default=600.0,
        help="first-answer only: seconds one cold process may take",
    )
    p.add_argument(
        "--waves", type=positive_int, default=None, help="serve only: requests per client (default 4; CPU 1)"
    )
    p.add_argument(
        "--body",
        type=json.loads,
        default=None,
        metavar="JSON",
        help='serve only: fields added to every request (\'{"logprobs": true, "top_logprobs": 5}\', a response_format)',
    )
    p.add_argument(
        "--bodies",
        type=body_names,
        default=None,
        metavar="NAMES",
        help="serve only: compare these bodies (plain, logprobs, schema) against plain on one server, no peer",
    )
    p.add_argument(
        "--repeats", type=positive_int, default=1, help="serve --bodies only: rounds of every body, in turn"
    )
    p.add_argument(
        "--peer",
        choices=("auto", "serve", "generate", "none"),
        default="auto",
        help="serve only: transformers serve (auto: in-process generate when it cannot run), generate, or none",
    )

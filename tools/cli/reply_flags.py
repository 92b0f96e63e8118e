"""``graphrt generate``'s reply options beyond sampling: log-probabilities, penalties, a
response format (what the OpenAI server takes as request fields)."""

from __future__ import annotations

import argparse
import json


def reply_args(p: argparse.ArgumentParser) -> None:
    """``--logprobs``, the three penalties and ``--response-format`` (``graphrt generate``)."""
    p.add_argument(
        "--logprobs",
        type=int,
        default=None,
        metavar="N",
        help="with --json: each output token's log-probability and the N (0..20) best",
    )
    for name, neutral, allowed in (
        ("presence", 0.0, "[-2, 2]"),
        ("frequency", 0.0, "[-2, 2]"),
        ("repetition", 1.0, "(0, 10]"),
    ):
        p.add_argument(
            f"--{name}-penalty",
            type=float,
            default=neutral,
            help=f"{name} penalty in {allowed} ({neutral}: off)",
        )
    p.add_argument(
        "--response-format",
        type=json.loads,
        default=None,
        metavar="JSON",
        help='OpenAI\'s response_format: \'{"type": "json_object"}\' or a json_schema (xgrammar)',
    )

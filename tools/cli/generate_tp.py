"""``graphrt generate --tp N``: every rank of a ``torchrun`` world runs rank 0's prompts.

Each rank builds its shard of the model; rank 0 schedules and samples (``Engine.generate``
across the group) and prints the records, all at once and without timings.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

from graphrt.engine import Engine
from graphrt.parallel import shutdown
from graphrt.replies import Completion
from graphrt.step.sampling import SamplingParams
from graphrt.text.tokenizer import (
    NoTokenizer,
    Tokenizer,
    chat_prompt,
    declared_stop_ids,
    load_tokenizer,
    reply_tokens,
)
from graphrt.tools.cli.args import UsageError
from graphrt.tools.cli.generate import Item, check_fit, engine_options, record


def _tokenizer(model: str, required: bool) -> Tokenizer | None:
    try:
        return load_tokenizer(model)
    except (NoTokenizer, ImportError) as err:
        if required:
            raise UsageError("--prompt", model, f"needs a tokenizer: {err} (--prompt-ids)") from err
        return None


def run_tp(args: argparse.Namespace, items: list[Item], sampling: SamplingParams) -> int:
    tokenizer = _tokenizer(args.model, any(i.ids is None for i in items))
    stops = tokenizer.stop_ids if tokenizer is not None else frozenset(declared_stop_ids(args.model))
    ids = [
        i.ids
        if i.ids is not None
        else tokenizer.encode_chat(i.messages)
        if i.messages
        else chat_prompt(tokenizer, i.text or "")  # type: ignore[union-attr]
        for i in items
    ]
    budgets = [i.max_new_tokens or args.max_new_tokens for i in items]
    check_fit(args, ids, budgets)
    params = dataclasses.replace(sampling, stop_token_ids=tuple(sorted(stops)))
    size = args.max_batch_size or min(len(items), 32)
    try:
        engine = Engine(args.model, tp=args.tp, **engine_options(args, size))
        outs = engine.generate(ids, budgets, params)
        engine.close()
        if engine.tp.is_driver:  # NOTE: every rank holds the replies; rank 0 prints them
            for prompt, out in zip(ids, outs, strict=True):
                reply = reply_tokens(out, stops)
                text = None if tokenizer is None else tokenizer.decode(reply)
                reason = "stop" if len(reply) < len(out) else "length"
                done = Completion(text, reply, reason, len(prompt), len(out))
                single = len(items) == 1 and not args.json and not args.prompts_file and text is not None
                print(
                    text if single else json.dumps(record(prompt, done, 0.0, None, None), ensure_ascii=False)
                )
    finally:
        shutdown()
    return 0

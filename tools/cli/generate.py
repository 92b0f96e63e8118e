"""``graphrt generate``: one prompt through a checkpoint with graphs, text streamed as it decodes.

With ``--tp N`` (under ``torchrun --nproc-per-node N``) every rank holds its shard of the
model and runs rank 0's steps (sampled ones included); the reply is printed by rank 0 only, in
the same form as with one rank (all at once instead of streamed).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from graphrt.engine import Engine
from graphrt.parallel import shutdown
from graphrt.step.sampling import SamplingParams
from graphrt.text.tokenizer import chat_prompt, load_tokenizer, reply_tokens, stop_ids
from graphrt.tools.cli.args import UsageError, resolve_device


def prompt_ids(args: argparse.Namespace, tokenizer: object) -> list[int]:
    """``--prompt-ids 1,2,3`` as given, else ``--prompt`` through the model's chat template."""
    if args.prompt_ids is not None:
        return list(args.prompt_ids)
    return chat_prompt(tokenizer, args.prompt)


def _sampling(args: argparse.Namespace) -> SamplingParams:
    try:
        return SamplingParams(args.temperature, args.top_k, args.top_p, seed=args.seed)
    except ValueError as err:  # NOTE: names the field, the value and the allowed range
        raise UsageError("--temperature/--top-k/--top-p", "", str(err)) from err


def run_generate(args: argparse.Namespace) -> int:
    """``graphrt generate``: stream the reply as text (or print one JSON object with ``--json``)."""
    tp = getattr(args, "tp", 1)
    device = resolve_device(args.device)
    sampling = _sampling(args)
    tokenizer = load_tokenizer(args.model)
    ids = prompt_ids(args, tokenizer)
    if len(ids) + args.max_new_tokens > args.max_context_len:
        raise UsageError(
            "--max-new-tokens",
            args.max_new_tokens,
            f"does not fit: the prompt has {len(ids)} tokens and --max-context-len is {args.max_context_len}",
        )
    options = dict(
        device=device,
        max_batch_size=1,
        max_context_len=args.max_context_len,
        kv_cache_dtype=args.kv_cache_dtype,
    )
    if tp == 1:
        engine = Engine(args.model, **options)
        _stream(args, engine, tokenizer, ids, sampling)
        return 0
    try:
        engine = Engine(args.model, tp=tp, **options)
        reply = engine.generate([ids], args.max_new_tokens, sampling)[0]
        out = reply_tokens(reply, stop_ids(tokenizer, args.model))
        engine.close()
        if engine.tp.is_driver:  # NOTE: every rank holds the reply; rank 0 prints it
            _print(args, tokenizer, ids, out, shown="")
    finally:
        shutdown()
    return 0


def _stream(
    args: argparse.Namespace, engine: Engine, tokenizer: Any, ids: list[int], sampling: SamplingParams
) -> None:
    """One rank: step the engine and write the reply's new text as each token comes."""
    rid = engine.add_request(ids, args.max_new_tokens, sampling)
    stop, out = stop_ids(tokenizer, args.model), []
    shown = ""
    while engine.waiting or engine.running:
        tokens = [t for r, t in engine.step() if r == rid]
        out.extend(tokens)
        if any(t in stop for t in tokens):
            out = reply_tokens(out, stop)
            break
        if not args.json:  # NOTE: decode the whole reply each time; BPE pieces join across tokens
            text = tokenizer.decode(out, skip_special_tokens=True)
            sys.stdout.write(text[len(shown) :])
            sys.stdout.flush()
            shown = text
    _print(args, tokenizer, ids, out, shown)


def _print(args: argparse.Namespace, tokenizer: Any, ids: list[int], out: list[int], shown: str) -> None:
    """The JSON object, or the reply's text not yet ``shown`` and a newline."""
    text = tokenizer.decode(out, skip_special_tokens=True)
    if args.json:
        print(json.dumps({"prompt_ids": ids, "output_ids": out, "text": text}))
    else:
        print(text[len(shown) :])


__all__ = ["run_generate"]

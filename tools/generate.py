"""``graphrt generate``: one prompt through a checkpoint with graphs, text streamed as it decodes."""

from __future__ import annotations

import argparse
import json
import sys

from graphrt.engine import Engine
from graphrt.models.tokenizer import chat_prompt, load_tokenizer, stop_ids
from graphrt.step.sampling import SamplingParams
from graphrt.tools.cli_args import UsageError, resolve_device


def prompt_ids(args: argparse.Namespace, tokenizer: object) -> list[int]:
    """``--prompt-ids 1,2,3`` as given, else ``--prompt`` through the model's chat template."""
    if args.prompt_ids is not None:
        return list(args.prompt_ids)
    return chat_prompt(tokenizer, args.prompt)


def run_generate(args: argparse.Namespace) -> int:
    """``graphrt generate``: stream the reply as text (or print one JSON object with ``--json``)."""
    device = resolve_device(args.device)
    try:
        sampling = SamplingParams(args.temperature, args.top_k, args.top_p, seed=args.seed)
    except ValueError as err:  # NOTE: names the field, the value and the allowed range
        raise UsageError("--temperature/--top-k/--top-p", "", str(err)) from err
    tokenizer = load_tokenizer(args.model)
    ids = prompt_ids(args, tokenizer)
    if len(ids) + args.max_new_tokens > args.max_context_len:
        raise UsageError(
            "--max-new-tokens",
            args.max_new_tokens,
            f"does not fit: the prompt has {len(ids)} tokens and --max-context-len is {args.max_context_len}",
        )
    engine = Engine(args.model, device=device, max_batch_size=1, max_context_len=args.max_context_len)
    rid = engine.add_request(ids, args.max_new_tokens, sampling)
    stop, out = stop_ids(tokenizer), []
    shown = ""
    while engine.waiting or engine.running:
        tokens = [t for r, t in engine.step() if r == rid]
        out.extend(tokens)
        if any(t in stop for t in tokens):
            out = out[: next(i for i, t in enumerate(out) if t in stop)]
            break
        if not args.json:  # NOTE: decode the whole reply each time; BPE pieces join across tokens
            text = tokenizer.decode(out, skip_special_tokens=True)
            sys.stdout.write(text[len(shown) :])
            sys.stdout.flush()
            shown = text
    text = tokenizer.decode(out, skip_special_tokens=True)
    if args.json:
        print(json.dumps({"prompt_ids": ids, "output_ids": out, "text": text}))
    else:
        print(text[len(shown) :])
    return 0


__all__ = ["run_generate"]

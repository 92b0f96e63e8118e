"""``graphrt generate``: prompts through a checkpoint with graphs; the reply streamed, or JSONL.

One prompt (``--prompt`` text through the chat template, or ``--prompt-ids``) streams its reply
as it decodes; with ``--json`` it prints one JSON line instead. ``--prompts-file FILE`` (JSONL,
``-`` for stdin) runs every prompt in the same engine steps (continuous batching) and prints
each reply with its counts and timings, in order (``--json``: one JSON line per prompt). A line of the file is ``{"prompt": text}`` (chat template),
``{"messages": [...]}``, ``{"prompt_ids": [...]}`` or a JSON string, with an optional
``"max_new_tokens"``. A record holds ``text`` (null without a tokenizer), ``prompt_ids``,
``output_ids``, ``finish_reason``, ``prompt_tokens``, ``completion_tokens``, ``ttft_s`` (from
the start of the run to this prompt's first token: prompts prefilled in the same step share
it), ``tokens_per_s`` (decode rate after the first token) and, with ``--logprobs N``,
``logprobs`` (per output token: its id, log-probability and the ``N`` best ``[id, logprob]``). Token ids
never need a tokenizer. ``--log-level info`` logs one line of phase timings.

With ``--tp N`` (under ``torchrun --nproc-per-node N``) every rank holds its shard and runs
rank 0's steps; rank 0 prints the records (all at once, without timings).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import dataclass
from typing import Any

from graphrt.replies import Completion
from graphrt.step.ints import is_int, token_ids
from graphrt.step.sampling import SamplingParams
from graphrt.tools.cli.args import UsageError, resolve_device
from graphrt.tools.cli.console import progress_wanted
from graphrt.tools.cli.phases import Phases

log = logging.getLogger("graphrt.generate")


@dataclass(slots=True)
class Item:
    """One prompt as given: exactly one of ``text``, ``messages``, ``ids``."""

    text: str | None = None
    messages: list[dict[str, Any]] | None = None
    ids: list[int] | None = None
    max_new_tokens: int | None = None


#: What a line of ``--prompts-file`` may be.
ITEM_SHAPE = (
    'is not a JSON string or an object with one of "prompt" (a string), "messages" (a list of '
    'objects), "prompt_ids" (token ids >= 0) and an optional "max_new_tokens" (an int > 0)'
)


def _item(value: Any, where: str) -> Item:
    """One line of ``--prompts-file``; ids and budgets are ints as given (graphrt.step.ints)."""
    if isinstance(value, str):
        return Item(text=value)
    keys = {"prompt", "messages", "prompt_ids"} & set(value if isinstance(value, dict) else ())
    budget = value.get("max_new_tokens") if isinstance(value, dict) else None
    if len(keys) != 1 or not (budget is None or (is_int(budget) and budget > 0)):
        raise UsageError("--prompts-file", where, ITEM_SHAPE)
    prompt, messages, ids = (value.get(k) for k in ("prompt", "messages", "prompt_ids"))
    if "prompt_ids" in keys:
        try:
            ids = token_ids(ids, "prompt_ids")
        except TypeError as err:
            raise UsageError("--prompts-file", where, f"{ITEM_SHAPE}: {err}") from err
        if not ids or min(ids) < 0:
            raise UsageError("--prompts-file", where, ITEM_SHAPE)
    chat = isinstance(messages, list) and all(isinstance(m, dict) for m in messages)
    if ("prompt" in keys and not isinstance(prompt, str)) or ("messages" in keys and not chat):
        raise UsageError("--prompts-file", where, ITEM_SHAPE)
    return Item(prompt, messages, ids, budget)


def read_items(args: argparse.Namespace) -> list[Item]:
    """The prompts of ``--prompt``, ``--prompt-ids`` or ``--prompts-file`` (``-``: stdin)."""
    if args.prompt is not None:
        return [Item(text=args.prompt)]
    if args.prompt_ids is not None:
        return [Item(ids=list(args.prompt_ids))]
    name = args.prompts_file
    try:
        lines = sys.stdin.readlines() if name == "-" else open(name, encoding="utf-8").readlines()  # noqa: SIM115
    except OSError as err:
        raise UsageError("--prompts-file", name, f"cannot be read ({err.strerror})") from err
    items = []
    for n, line in enumerate(lines, 1):
        if line.strip():
            try:
                value = json.loads(line)
            except json.JSONDecodeError as err:
                raise UsageError("--prompts-file", f"{name}:{n}", f"is not JSON ({err.msg})") from err
            items.append(_item(value, f"{name}:{n}"))
    if not items:
        raise UsageError("--prompts-file", name, "holds no prompt")
    return items


def _sampling(args: argparse.Namespace) -> SamplingParams:
    try:
        extra = {
            k: getattr(args, k)
            for k in ("logprobs", "presence_penalty", "frequency_penalty", "repetition_penalty")
            if hasattr(args, k)
        }
        return SamplingParams(args.temperature, args.top_k, args.top_p, seed=args.seed, **extra)
    except ValueError as err:  # NOTE: names the field, the value and the allowed range
        raise UsageError("--temperature/--top-k/--top-p/--seed/--logprobs", "", str(err)) from err


def _prompt_ids(llm: Any, item: Item) -> list[int]:
    if item.ids is not None:
        return item.ids
    if item.messages is not None:
        return llm.encode_chat(item.messages)
    from graphrt.text.tokenizer import chat_prompt

    return chat_prompt(llm.tokenizer, item.text or "")


def engine_options(args: argparse.Namespace, max_batch_size: int) -> dict[str, Any]:
    """The engine's options from the flags (the same for one rank and for TP)."""
    return {
        "device": resolve_device(args.device),
        "max_batch_size": max_batch_size,
        "max_context_len": args.max_context_len,
        "kv_cache_dtype": args.kv_cache_dtype,
        "quantization": args.quantization,
        "deterministic": args.deterministic,
        "speculative": args.speculative,
        "capture": getattr(args, "capture", "lazy"),  # NOTE: every rank of --tp the same
    }


def check_fit(args: argparse.Namespace, ids: list[list[int]], budgets: list[int]) -> None:
    """Each prompt and its budget within ``--max-context-len`` (else the flag and numbers)."""
    for n, (p, b) in enumerate(zip(ids, budgets, strict=True)):
        if len(p) + b > args.max_context_len:
            flag = "--max-new-tokens" if len(ids) == 1 else f"--prompts-file (prompt {n + 1})"
            limit = args.max_context_len
            raise UsageError(
                flag, b, f"does not fit: the prompt has {len(p)} tokens and --max-context-len is {limit}"
            )


def run_generate(args: argparse.Namespace) -> int:
    """``graphrt generate``: stream one reply as text, or print one JSON line per prompt."""
    phases = Phases.since_process_start()
    items = read_items(args)
    sampling = _sampling(args)
    if args.tp != 1:
        from graphrt.tools.cli.generate_tp import run_tp

        return run_tp(args, items, sampling)
    from graphrt.llm import LLM
    from graphrt.text import NoTokenizer

    text = any(i.ids is None for i in items)
    size = args.max_batch_size or min(len(items), 32)
    kw = engine_options(args, size)
    try:
        llm = LLM(args.model, tokenizer=True if text else None, show_progress=progress_wanted(), **kw)
    except NoTokenizer as err:
        raise UsageError("--prompt", args.model, f"needs a tokenizer: {err} (--prompt-ids)") from err
    phases.add("tokenizer", llm.timings["tokenizer"])
    phases.add("load", llm.timings["load"])
    phases.add("capture", llm.timings["capture"])
    ids = [_prompt_ids(llm, i) for i in items]
    budgets = [i.max_new_tokens or args.max_new_tokens for i in items]
    check_fit(args, ids, budgets)
    stream = len(items) == 1 and not args.json and not args.prompts_file and llm.tokenizer is not None
    try:
        make = llm._constraint(getattr(args, "response_format", None))
    except ValueError as err:
        raise UsageError("--response-format", "", str(err)) from err
    records = _run(llm, ids, budgets, sampling, phases, stream, make)
    if llm.engine.use_graphs and llm.engine.config.capture == "lazy":
        # NOTE: inside the first token and decode phases: each graph on the step that first ran it
        phases.add("captured on first use", llm.engine.runtime.report().seconds)
    if not stream:
        for n, r in enumerate(records, 1):
            print(json.dumps(r, ensure_ascii=False) if args.json else human(r, n, len(records)))
    log.info("%s", phases.line(sum(r["completion_tokens"] for r in records)))
    return 0


def _run(
    llm: Any,
    ids: list[list[int]],
    budgets: list[int],
    sampling: SamplingParams,
    phases: Phases,
    stream: bool,
    make: Any = None,
) -> list[dict[str, Any]]:
    """Every prompt in the same steps; each one's record (and the one reply's text, streamed)."""
    replies, start = llm.replies, time.perf_counter()
    rids = [replies.add(p, b, sampling, (), make and make()) for p, b in zip(ids, budgets, strict=True)]
    first: dict[int, float] = {}
    done: dict[int, tuple[Completion, float]] = {}
    while len(done) < len(rids):
        for u in replies.step():
            now = time.perf_counter()
            first.setdefault(u.rid, now)
            if stream:
                sys.stdout.write(u.text)
                sys.stdout.flush()
            if u.done is not None:
                done[u.rid] = (u.done, now)
    if stream:
        print()
    end = time.perf_counter()
    phases.add("first token", min(first.values()) - start)
    phases.add("decode", end - min(first.values()))
    return [record(p, *done[r], first[r] - start, first[r]) for p, r in zip(ids, rids, strict=True)]


def record(
    prompt: list[int], c: Completion, ended: float, ttft: float | None, first: float | None
) -> dict[str, Any]:
    """One prompt's JSON record (timings None where not measured)."""
    rate = None
    if ttft is not None and first is not None and c.completion_tokens > 1 and ended > first:
        rate = round((c.completion_tokens - 1) / (ended - first), 2)
    out = {
        "text": c.text,
        "prompt_ids": prompt,
        "output_ids": c.token_ids,
        "finish_reason": c.finish_reason,
        "prompt_tokens": c.prompt_tokens,
        "completion_tokens": c.completion_tokens,
        "ttft_s": None if ttft is None else round(ttft, 4),
        "tokens_per_s": rate,
    }
    if c.logprobs is not None:
        out["logprobs"] = [
            {
                "id": e.token,
                "logprob": e.logprob,
                "top": [list(t) for t in zip(e.top_ids, e.top_logprobs, strict=True)],
            }
            for e in c.logprobs
        ]
    return out


def human(r: dict[str, Any], n: int, total: int) -> str:
    """Record ``r`` (prompt ``n`` of ``total``) for a reader: the reply, then one line of facts."""
    text = r["text"] if r["text"] is not None else " ".join(map(str, r["output_ids"]))
    timing = "" if r["ttft_s"] is None else f", first token {r['ttft_s']:.3f} s"
    rate = "" if r["tokens_per_s"] is None else f", {r['tokens_per_s']:.1f} tokens/s"
    facts = (
        f"[{r['finish_reason']}: {r['prompt_tokens']} prompt + {r['completion_tokens']} new tokens"
        f"{timing}{rate}]"
    )
    return f"--- prompt {n}/{total}\n{text.strip()}\n{facts}"


__all__ = ["Item", "read_items", "record", "run_generate"]

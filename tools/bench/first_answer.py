"""``graphrt bench first-answer``: a cold process's time to its first answer, lazy vs eager capture.

Each run is a fresh interpreter (``sys.executable``, this environment) that imports graphrt,
builds ``LLM(--model, capture=...)`` with the sizes ``graphrt serve`` uses, and answers one
chat message (greedy, ``--max-tokens`` tokens, default 16). Runs alternate lazy and eager,
``--runs`` of each (default 3), after one untimed eager run that fills the conversion cache and
Triton's kernel cache (a cold *process* on a warm machine, as a user's second start). Per run,
seconds from the process's start (the kernel's clock: the interpreter's start counts, as a user
waits for it) to ``import graphrt`` done, to the LLM built and to the answer; the LLM's own
timings; the graphs captured and pending once it answered, their capture seconds and pool bytes;
the answer's tokens, which must not depend on the policy (``tokens_equal``).
JSON: ``<out>/first_answer_<UTC time>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np
from rich.table import Table

from graphrt.tools.bench.record import header, write_result
from graphrt.tools.cli.args import AUTO, resolve_device
from graphrt.tools.cli.console import wide_console

#: The message every run answers.
PROMPT = "What is the capital of France?"
#: Tokens an answer has unless ``--max-tokens`` says.
TOKENS = 16
#: What a child prints before its JSON facts (the last such line of its stdout is read).
MARK = "FIRST_ANSWER "

#: The child: everything it times happens in a process that has run nothing else.
CHILD = r"""
import json, sys
import graphrt
from graphrt.tools.cli.phases import process_age
imported = process_age()
cfg = json.loads(sys.argv[1])
llm = graphrt.LLM(cfg["model"], capture=cfg["capture"], device=cfg["device"])
built = process_age()
if llm.tokenizer is not None:
    done = llm.chat([{"role": "user", "content": cfg["prompt"]}], max_new_tokens=cfg["tokens"])[0]
else:
    done = llm.generate([1, 2, 3], max_new_tokens=cfg["tokens"])[0]
answered = process_age()
report = llm.engine.runtime.report()
facts = {
    "import_s": imported, "built_s": built, "answered_s": answered, "timings": llm.timings,
    "graphs": len(report.graphs), "pending": len(report.pending), "capture_s": report.seconds,
    "pool_bytes": report.pool_bytes, "captured": sorted(f"{g.key[0].name}:{g.key[1]}" for g in report.graphs),
    "text": done.text, "token_ids": done.token_ids,
}
print("FIRST_ANSWER " + json.dumps(facts), flush=True)
"""


def cold_run(model: str, capture: str, device: str | None, tokens: int, timeout_s: float) -> dict[str, Any]:
    """One cold process's facts (:data:`CHILD`), plus ``wall_s`` from its spawn to its exit."""
    cfg = {"model": model, "capture": capture, "device": device, "prompt": PROMPT, "tokens": tokens}
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, json.dumps(cfg)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=os.environ.copy(),
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the {capture} run took over {timeout_s:g} s (--run-timeout)") from None
    wall = time.perf_counter() - start
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        tail = "\n".join(proc.stderr.splitlines()[-15:])
        raise RuntimeError(f"the {capture} run exited with {proc.returncode}:\n{tail}")
    return json.loads(lines[-1].removeprefix(MARK)) | {"capture": capture, "wall_s": wall}


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and range of each time of one policy's runs, and its last run's graphs."""
    out: dict[str, Any] = {}
    for key in ("import_s", "built_s", "answered_s", "wall_s", "capture_s"):
        values = np.array([r[key] for r in runs], dtype=float)
        out[key] = {
            "median": float(np.median(values)),
            "min": float(values.min()),
            "max": float(values.max()),
        }
    last = runs[-1]
    return out | {k: last[k] for k in ("graphs", "pending", "pool_bytes", "captured")}


def run_bench_first_answer(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    child_device = None if args.device == AUTO else str(device)
    tokens = args.max_tokens or TOKENS
    warm = cold_run(args.model, "eager", child_device, tokens, args.run_timeout)
    print(f"warm-up run (untimed): answered {warm['answered_s']:.2f} s after its start")
    runs: list[dict[str, Any]] = []
    for i in range(args.runs):
        for capture in ("lazy", "eager") if i % 2 == 0 else ("eager", "lazy"):
            runs.append(cold_run(args.model, capture, child_device, tokens, args.run_timeout))
            print(f"run {len(runs)}: {capture} answered {runs[-1]['answered_s']:.2f} s after its start")
    by = {c: [r for r in runs if r["capture"] == c] for c in ("lazy", "eager")}
    answers = {json.dumps(r["token_ids"]) for r in runs}
    result = header("first-answer", args, device) | {
        "model": args.model,
        "prompt": PROMPT,
        "tokens": tokens,
        "lazy": summary(by["lazy"]),
        "eager": summary(by["eager"]),
        "runs": runs,
        "warmup": warm,
        "tokens_equal": len(answers | {json.dumps(warm["token_ids"])}) == 1,
    }
    lazy, eager = result["lazy"]["answered_s"]["median"], result["eager"]["answered_s"]["median"]
    result["answer_speedup"] = eager / lazy if lazy > 0 else None
    out = write_result(result, args.out, "first_answer")
    _print(result, str(out))
    return 0 if result["tokens_equal"] else 1


def _print(result: dict[str, Any], out: str) -> None:
    table = Table(
        title=f"{result['model']}: a cold process's first answer ({result['tokens']} tokens), "
        f"lazy vs eager capture ({result['env']['device']}); seconds since the process started, median (min-max)"
    )
    for col in ("capture", "import", "LLM built", "answered", "wall", "capture s", "graphs", "pending"):
        table.add_column(col, justify="right")
    for key in ("lazy", "eager"):
        m = result[key]
        times = [_cell(m[k]) for k in ("import_s", "built_s", "answered_s", "wall_s", "capture_s")]
        table.add_row(key, *times, str(m["graphs"]), str(m["pending"]))
    speedup = result["answer_speedup"]
    table.caption = (
        f"first answer {speedup:.2f}x sooner lazily; " if speedup else ""
    ) + f"tokens {'equal' if result['tokens_equal'] else 'DIFFER'}"
    console = wide_console()
    console.print(table)
    console.print(f"written to {out}")


def _cell(stats: dict[str, float]) -> str:
    return f"{stats['median']:.2f} ({stats['min']:.2f}-{stats['max']:.2f})"

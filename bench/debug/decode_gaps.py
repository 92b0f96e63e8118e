"""Where a constrained or speculative bs-1 decode loses time against a plain one: the device timeline.

Usage (GPU machine): ``python bench/debug/decode_gaps.py MODEL [TOKENS] [DEVICE]``.
Builds ``LLM(MODEL)`` with the server's defaults (token masks on, overlapped), answers one chat
prompt greedily, plain and then under a JSON schema, each once to capture and once under the
benches' profiler (``device_ops``). Per generated token it prints the wall time, the device's
busy time and its idle time, and the idle gaps grouped by the kernels on either side (the
kernel that ended, the one that started next): a gap between the forward graph's last kernel
and the sampler graph's first is the host's ``ready`` (read, accept, fill, upload) showing
through; a gap before a step's first kernel is the host's step. Then the same for an n-gram
speculative engine on the plain prompt (chat text: it backs off most steps). A diagnostic, not
a result.
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from collections.abc import Sequence

from graphrt import LLM
from graphrt.tools.bench.device_ops import Op, device_ops, family, kernel_breakdown

SCHEMA = {
    "type": "json_schema",
    "json_schema": {
        "name": "answer",
        "schema": {
            "type": "object",
            "properties": {
                "answer": {"type": "string"},
                "steps": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["answer", "steps"],
        },
    },
}
PROMPT = [{"role": "user", "content": "Explain step by step how to boil an egg. Answer in JSON."}]
#: Gaps shorter than this (µs) are a kernel boundary, not idle time worth naming.
SMALL = 2.0


def gaps(ops: Sequence[Op]) -> dict[tuple[str, str], list[float]]:
    """Idle gaps over ``SMALL`` µs between consecutive device intervals, by (ended, started)."""
    found: dict[tuple[str, str], list[float]] = defaultdict(list)
    ordered = sorted(ops, key=lambda o: o.start)
    reach, last = ordered[0].end, ordered[0]
    for op in ordered[1:]:
        if op.start - reach > SMALL:
            found[(family(last.name)[:40], family(op.name)[:40])].append(op.start - reach)
        if op.end > reach:
            reach, last = op.end, op
    return found


def show(label: str, llm: LLM, tokens: int, fmt: dict | None) -> None:
    keywords = {} if fmt is None else {"response_format": fmt}
    llm.chat(PROMPT, max_new_tokens=tokens, temperature=0, **keywords)  # NOTE: captures the pair
    device = llm.engine.device
    start = time.perf_counter()
    with device_ops(device) as ops:
        out = llm.chat(PROMPT, max_new_tokens=tokens, temperature=0, **keywords)[0]
    wall = (time.perf_counter() - start) * 1e6
    n = out.completion_tokens
    found = kernel_breakdown(ops, n, top=16)
    print(f"{label}: {n} tokens, wall {wall / n:.1f} µs a token", end="")
    if found["busy_us"] is None:
        print(" (no device timeline on this device)")
        return
    print(
        f", device busy {found['busy_us']:.1f}, span {found['span_us']:.1f}, launches {found['launches']:.1f}"
    )
    for k in found["kernels"]:
        print(f"    {k['us']:8.1f} µs  x{k['launches']:.1f}  {k['kernel']}")
    ranked = sorted(gaps(ops).items(), key=lambda kv: -sum(kv[1]))[:10]
    print("  idle gaps a token (µs), by the kernel that ended -> the one that started:")
    for (ended, started), found_gaps in ranked:
        per = sum(found_gaps) / n
        print(
            f"    {per:8.1f} µs  x{len(found_gaps) / n:.2f}  max {max(found_gaps):7.1f}  {ended} -> {started}"
        )


def main(model: str, tokens: int, device: str) -> None:
    llm = LLM(model, device=device, max_batch_size=1)
    for label, fmt in (("plain", None), ("json schema", SCHEMA)):
        show(label, llm, tokens, fmt)
    llm.engine.close()
    # NOTE: a speculative engine that backs off on chat text: its idle gaps against plain's
    llm = LLM(model, device=device, max_batch_size=1, speculative={"method": "ngram", "num_steps": 4})
    show("ngram", llm, tokens, None)
    llm.engine.close()


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[0], int(args[1]) if len(args) > 1 else 128, args[2] if len(args) > 2 else "cuda")

"""``python -m graphrt.tools.bench.chunked`` on the CPU (tiny-llama): whole prompts against
chunked ones on MIXED graphs, the same tokens, the long prompt's chunks replayed, and
``--profile`` measuring nothing where there is no device to profile."""

from __future__ import annotations

import json
from pathlib import Path

from graphrt.tools.bench import chunked


def test_chunked_bench_compares_equal_tokens_and_counts_mixed_replays(tmp_path: Path) -> None:
    argv = ["--model", "tiny-llama", "--device", "cpu", "--clients", "2", "--long", "40", "--chunk", "16"]
    argv += ["--steady", "3", "--after", "2", "--profile", "4", "--out", str(tmp_path)]
    assert chunked.main(argv) == 0  # NOTE: 1 when the two engines' tokens differ
    result = json.loads(next(tmp_path.glob("chunked_*.json")).read_text())
    whole, parts = result["whole"], result["chunked"]
    # NOTE: the unchunked engine's two prefills (the clients', the 40-token prompt's) replay
    # prefill graphs (``prefill_graph_tokens``); none of its steps holds decode rows and chunks
    assert result["tokens_equal"] and whole["mixed_replays"] == 2 and whole["mixed_steps"] == 0
    assert parts["mixed_replays"] >= 40 // 16 and parts["itl_during_prefill_ms"]["n"] > 0
    assert parts["profile"] == {"steps": parts["profile"]["steps"], "busy_us": None, "span_us": None,
                                "idle_share": None, "kernels": []}  # fmt: skip

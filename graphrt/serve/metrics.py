"""``GET /metrics``: Prometheus gauges, histograms and counters for routers and autoscalers.

Names follow vLLM's (``vllm:num_requests_waiting`` ...) with the ``graphrt:`` prefix. The
three gauges the Gateway API Inference Extension's model-server protocol reads (queued
requests, running requests, KV-cache usage) are also exported under vLLM's names, which
endpoint pickers (llm-d's EPP) and vLLM's router read by default. Gauges are read from the
engine thread's last published :class:`~graphrt.serve.loop.LoopStats` at each scrape; the
histograms and counters are observed as each request ends.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from graphrt.serve.loop import LoopStats

#: Histogram buckets (seconds), vLLM's for time to first token and per output token.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0)
#: Gauge name -> how it reads from the loop's stats.
GAUGES = {
    "num_requests_running": ("Requests in the running batch", lambda s: s.running),
    "num_requests_waiting": ("Requests waiting to be scheduled", lambda s: s.waiting),
    "kv_cache_usage_perc": (
        "Fraction of KV-cache pages in use (1 = full)",
        lambda s: 1.0 - s.free_pages / s.pages if s.pages else 0.0,
    ),
}
#: Prefixes every gauge is exported under (the second: the model-server protocol's names).
GAUGE_PREFIXES = ("graphrt", "vllm")
#: A speculating server's gauges (``graphrt:`` only), read from the loop's stats.
SPEC_GAUGES = {
    "spec_decode_acceptance_rate": (
        "Accepted share of the drafts offered",
        lambda s: s.spec_accepted / s.spec_drafts if s.spec_drafts else 0.0,
    ),
    "spec_decode_tokens_per_round": (
        "Tokens committed per request per speculative step (1: no gain)",
        lambda s: s.spec_tokens_per_round,
    ),
    "spec_decode_paused_requests": ("Running requests paused by back-off", lambda s: s.spec_paused),
}
#: A speculating server's counters, advanced to the loop's totals at each scrape.
SPEC_COUNTERS = {
    "spec_decode_num_draft_tokens": ("Draft tokens offered", lambda s: s.spec_drafts),
    "spec_decode_num_accepted_tokens": ("Draft tokens accepted", lambda s: s.spec_accepted),
    "spec_decode_num_drafts": ("Verifies of a request's drafts", lambda s: s.spec_verifies),
}


@dataclass(slots=True)
class Timing:
    """One request's clock: when it arrived, each choice's first token and last token."""

    start: float = field(default_factory=time.perf_counter)
    first: dict[int, float] = field(default_factory=dict)
    last: dict[int, float] = field(default_factory=dict)
    tokens: dict[int, int] = field(default_factory=dict)

    def saw(self, choice: int, tokens: int) -> None:
        """Choice ``choice`` got ``tokens`` new tokens now."""
        if tokens <= 0:
            return
        now = time.perf_counter()
        self.first.setdefault(choice, now)
        self.last[choice] = now
        self.tokens[choice] = self.tokens.get(choice, 0) + tokens


class Metrics:
    """The server's Prometheus registry (one per app, so several apps live in one process)."""

    def __init__(self, model_name: str, *, speculative: bool = False) -> None:
        self.registry = CollectorRegistry()
        self.model = model_name
        labels = ["model_name"]
        self._gauges = [
            (Gauge(f"{prefix}:{name}", doc, labels, registry=self.registry).labels(model_name), read)
            for prefix in GAUGE_PREFIXES
            for name, (doc, read) in GAUGES.items()
        ]

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(f"graphrt:{name}", doc, labels, buckets=buckets, registry=self.registry)

        self.ttft = histogram("time_to_first_token_seconds", "Time to first token", TTFT_BUCKETS).labels(
            model_name
        )
        self.tpot = histogram("time_per_output_token_seconds", "Time per output token", TPOT_BUCKETS).labels(
            model_name
        )
        self.e2e = histogram("e2e_request_latency_seconds", "End-to-end request latency", E2E_BUCKETS).labels(
            model_name
        )

        def counter(name: str, doc: str) -> Counter:
            return Counter(f"graphrt:{name}", doc, labels, registry=self.registry)

        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens processed").labels(model_name)
        self.generation_tokens = counter("generation_tokens", "Tokens generated").labels(model_name)
        self.requests = counter("request_success", "Requests answered in full").labels(model_name)
        spec = speculative
        self._gauges += [
            (Gauge(f"graphrt:{name}", doc, labels, registry=self.registry).labels(model_name), read)
            for name, (doc, read) in (SPEC_GAUGES.items() if spec else ())
        ]
        self._totals = [
            (counter(name, doc), read, [0]) for name, (doc, read) in (SPEC_COUNTERS.items() if spec else ())
        ]

    def ended(self, timing: Timing, prompt_tokens: int) -> None:
        """A request answered in full: its latencies and token counts."""
        now = time.perf_counter()
        self.e2e.observe(now - timing.start)
        self.requests.inc()
        self.prompt_tokens.inc(prompt_tokens)
        for choice, first in timing.first.items():
            self.ttft.observe(first - timing.start)
            n = timing.tokens[choice]
            self.generation_tokens.inc(n)
            if n > 1:
                self.tpot.observe((timing.last[choice] - first) / (n - 1))

    def scrape(self, stats: LoopStats) -> bytes:
        """The exposition text, gauges read from ``stats``."""
        for gauge, read in self._gauges:
            gauge.set(read(stats))
        for total, read, seen in self._totals:
            now = read(stats)
            if now > seen[0]:  # NOTE: a counter only rises: add what the loop counted since
                total.labels(self.model).inc(now - seen[0])
                seen[0] = now
        return generate_latest(self.registry)

"""Two ``graphrt serve`` replicas behind SGLang's router (``sglang-router``, round robin), on
127.0.0.1: a bounded burst through the router is answered in full, each request exactly once
(the replicas' ``graphrt:request_success_total`` add up to the burst), and both replicas serve.
The commands are docs/serving.md's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.serve.test_serve import free_port
from tests.tools.test_cli_generate import needs_smollm2

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("sglang_router")

ROOT = Path(__file__).resolve().parents[2]
BURST = 12
REPLICA = ["--model", "smollm2", "--device", "cpu", "--max-batch-size", "4", "--max-context-len", "256"]


def _replica(port: int) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "graphrt", "serve", *REPLICA, "--port", str(port), "--threads", "1"]
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    return subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)


def _ready(proc: subprocess.Popen[str]) -> None:
    assert proc.stderr is not None
    lines = []
    for line in proc.stderr:  # NOTE: the server says when it listens
        lines.append(line)
        if "ready in" in line:
            return
    raise AssertionError("".join(lines))


def _served(port: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    line = next(x for x in text.splitlines() if x.startswith("graphrt:request_success_total{"))
    return float(line.rsplit(" ", 1)[1])


@pytest.fixture(scope="module")
def router() -> Iterator[tuple[str, list[int]]]:
    ports = [free_port(), free_port()]
    procs = [_replica(p) for p in ports]
    try:
        for proc in procs:
            _ready(proc)
        port = free_port()
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        cmd = [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", *urls]
        cmd += ["--host", "127.0.0.1", "--port", str(port), "--policy", "round_robin", "--log-level", "warn"]
        cmd += ["--prometheus-port", str(free_port())]  # NOTE: its default (29000) may be taken
        procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and procs[-1].poll() is None, "the router did not start"
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}", ports
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=60)


@needs_smollm2
@pytest.mark.slow
def test_a_burst_through_the_router_is_answered_once_each(router: tuple[str, list[int]]) -> None:
    url, ports = router
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=300)
    before = [_served(p) for p in ports]

    def ask(i: int) -> str:
        reply = client.completions.create(model="smollm2", prompt=f"{i} + {i} =", max_tokens=3, temperature=0)
        assert len(reply.choices) == 1 and reply.choices[0].finish_reason in ("stop", "length")
        return reply.choices[0].text

    with ThreadPoolExecutor(BURST) as pool:
        replies = list(pool.map(ask, range(BURST)))
    assert len(replies) == BURST
    served = [_served(p) - b for p, b in zip(ports, before, strict=True)]
    assert sum(served) == BURST and min(served) > 0, served

"""``graphrt bench serve``'s load: streamed requests from client processes, samples in order."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from graphrt.tools.bench.serve_load import client_processes, run_load


class _Echo(BaseHTTPRequestHandler):
    """A chat endpoint that streams the prompt's words back, one SSE chunk each, then usage."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        words = body["messages"][0]["content"].split()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for word in words:
            chunk = {"choices": [{"index": 0, "delta": {"content": word + " "}}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        usage = {"choices": [], "usage": {"completion_tokens": len(words)}}
        self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def echo_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def test_client_processes_keep_prompt_order_and_report_their_cpu(echo_url: str) -> None:
    prompts = [" ".join(f"w{i}" for i in range(n + 1)) for n in range(7)]
    spread = run_load(echo_url, "m", prompts, concurrency=3, max_tokens=8, processes=2)
    alone = run_load(echo_url, "m", prompts, concurrency=3, max_tokens=8, processes=1)
    for load in (spread, alone):
        assert [s.text for s in load.samples] == [p + " " for p in prompts]
        assert [s.tokens for s in load.samples] == list(range(1, 8))
        assert load.client_cpu_share is not None and load.client_cpu_share >= 0.0
    assert spread.client_processes == 2 and alone.client_processes == 1
    assert spread.summary()["client_processes"] == 2


def test_client_processes_leave_the_server_half_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    assert [client_processes(c) for c in (1, 4, 8, 32)] == [1, 4, 8, 8]
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert client_processes(32) == 1

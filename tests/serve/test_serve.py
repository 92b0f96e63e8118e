"""``graphrt serve`` live: the official ``openai`` client against a server in a subprocess.

16 concurrent clients (completions and chat, streamed and not) share the one engine thread;
each greedy reply equals ``LLM.generate`` / ``LLM.chat`` in this process (one batched call:
tests/test_llm.py shows a batch equals solo runs). A malformed request gets a 400 naming the
field; a client leaving mid-stream frees its request (``/health``: nothing runs or waits,
every page free); Ctrl-C stops the server with exit code 0.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.tools.test_cli_generate import needs_smollm2

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

ROOT = Path(__file__).resolve().parents[2]
SIZES = ["--max-batch-size", "8", "--max-context-len", "256"]
NEW = 8
TEXTS = [
    "Once upon a time",
    "The three primary colours are",
    "def fibonacci(n):",
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three fruits:",
    "The quick brown fox",
    "In 1969, the first",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def expected_replies() -> dict[str, list[str]]:
    """``LLM.generate`` and ``LLM.chat`` here, eagerly (tests/test_engine: same tokens as graphs)."""
    from graphrt import LLM

    llm = LLM("smollm2", device="cpu", max_batch_size=8, max_context_len=256, use_graphs=False)
    chats = [[{"role": "user", "content": t}] for t in TEXTS]
    return {
        "completion": [c.text or "" for c in llm.generate(TEXTS, max_new_tokens=NEW)],
        "chat": [c.text or "" for c in llm.chat(chats, max_new_tokens=NEW)],
    }


def start(*extra: str) -> tuple[subprocess.Popen[str], str, list[str]]:
    """``graphrt serve`` on a free port (``extra`` flags): the process, its URL, the lines of
    stderr up to the ready line."""
    port = free_port()
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "graphrt", "serve", "--model", "smollm2", "--device", "cpu"]
    proc = subprocess.Popen(
        [*cmd, "--port", str(port), *SIZES, *extra], env=env, stderr=subprocess.PIPE, text=True
    )
    return proc, f"http://127.0.0.1:{port}", []


def ready(proc: subprocess.Popen[str], lines: list[str]) -> None:
    """Wait for the server's ready line (it says when it listens)."""
    assert proc.stderr is not None
    for line in proc.stderr:
        lines.append(line)
        if "ready in" in line:
            break
    assert proc.poll() is None, "".join(lines)


@pytest.fixture(scope="module")
def live() -> Iterator[tuple[str, dict[str, list[str]]]]:
    """The server's URL, and the expected replies (computed while it starts)."""
    proc, url, lines = start()
    assert proc.stderr is not None
    try:
        expected = expected_replies()
        ready(proc, lines)
    except BaseException:
        proc.kill()
        raise
    yield url, expected
    proc.send_signal(signal.SIGINT)
    rest = proc.stderr.read()
    assert proc.wait(timeout=60) == 0, rest
    assert "graphrt serve: stopped" in rest and "Traceback" not in rest, rest


@pytest.fixture(scope="module")
def server(live: tuple[str, dict[str, list[str]]]) -> str:
    return live[0]


@pytest.fixture(scope="module")
def expected(live: tuple[str, dict[str, list[str]]]) -> dict[str, list[str]]:
    return live[1]


def ask(client: object, kind: str, stream: bool, text: str) -> tuple[str, str | None, int | None]:
    """One request: the reply's text, finish reason and completion tokens (usage)."""
    args = {"model": "smollm2", "max_tokens": NEW, "temperature": 0, "stream": stream}
    if stream:
        args["stream_options"] = {"include_usage": True}
    if kind == "completion":
        reply = client.completions.create(prompt=text, **args)  # type: ignore[attr-defined]
    else:
        messages = [{"role": "user", "content": text}]
        reply = client.chat.completions.create(messages=messages, **args)  # type: ignore[attr-defined]
    if not stream:
        choice = reply.choices[0]
        body = choice.text if kind == "completion" else choice.message.content
        return body, choice.finish_reason, reply.usage.completion_tokens
    pieces, finish, used = [], None, None
    for chunk in reply:
        if chunk.usage is not None:
            used = chunk.usage.completion_tokens
        for choice in chunk.choices:
            piece = choice.text if kind == "completion" else choice.delta.content
            pieces.append(piece or "")
            finish = choice.finish_reason or finish
    return "".join(pieces), finish, used


@needs_smollm2
def test_sixteen_concurrent_clients_get_their_solo_replies(
    server: str, expected: dict[str, list[str]]
) -> None:
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="none", max_retries=0)
    jobs = [
        (kind, stream, i) for kind in ("completion", "chat") for stream in (False, True) for i in range(4)
    ]
    jobs = [(kind, stream, i + 4 * (stream and kind == "chat")) for kind, stream, i in jobs]
    with ThreadPoolExecutor(len(jobs)) as pool:
        replies = list(pool.map(lambda j: ask(client, j[0], j[1], TEXTS[j[2]]), jobs))
    assert len(jobs) == 16
    for (kind, stream, i), (text, finish, used) in zip(jobs, replies, strict=True):
        assert text == expected[kind][i], (kind, stream, i)
        assert finish in ("stop", "length") and used is not None and 1 <= used <= NEW
    models = client.models.list()
    assert [m.id for m in models.data] == ["smollm2"]


@needs_smollm2
def test_malformed_requests_get_a_400_naming_the_field(server: str) -> None:
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="none", max_retries=0)
    cases = [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"n": 0}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 10_000}, "prompt"),
    ]
    for extra, field in cases:
        with pytest.raises(openai.BadRequestError) as err:
            client.completions.create(model="smollm2", prompt="hi", **extra)  # type: ignore[arg-type]
        assert err.value.status_code == 400 and field in str(err.value), (extra, err.value)
    with pytest.raises(openai.BadRequestError, match="messages"):
        client.chat.completions.create(model="smollm2", messages=[{"role": "robot", "content": "x"}])  # type: ignore[list-item]
    raw = httpx.post(
        f"{server}/v1/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert raw.status_code == 400 and raw.json()["error"]["type"] == "invalid_request_error"


@needs_smollm2
def test_a_client_leaving_mid_stream_frees_its_request(server: str) -> None:
    # NOTE: a reply that runs its whole budget (200 tokens, greedy, measured); "Tell me a long
    # story." as a plain completion ends at EOS after one token, so the reply could finish
    # before the server saw the client leave (seen once in CI).
    ask = "Write a very long story about a dragon, in many paragraphs."
    body = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": ask}],
        "max_tokens": 200,
        "stream": True,
    }
    with httpx.stream("POST", f"{server}/v1/chat/completions", json=body, timeout=60) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
    deadline = time.monotonic() + 30
    while True:
        health = httpx.get(f"{server}/health").json()
        if health["aborted"] >= 1 and not health["running"] and not health["waiting"]:
            break
        assert time.monotonic() < deadline, health
        time.sleep(0.2)
    assert health["free_pages"] == health["pages"] and health["free_rows"] == health["rows"], health
    assert health["status"] == "ok" and health["errors"] == 0


#: A reply that runs its whole 200-token budget (see the test above).
LONG = {
    "model": "smollm2",
    "messages": [{"role": "user", "content": "Write a very long story about a dragon, in many paragraphs."}],
    "max_tokens": 200,
    "temperature": 0,
}


def settled(server: str, aborted: int) -> dict:
    """``/health`` once nothing runs or waits and ``aborted`` requests have been aborted."""
    deadline = time.monotonic() + 30
    while True:
        health = httpx.get(f"{server}/health").json()
        if health["aborted"] >= aborted and not health["running"] and not health["waiting"]:
            return health
        assert time.monotonic() < deadline, health
        time.sleep(0.2)


@needs_smollm2
def test_a_client_leaving_a_whole_reply_frees_its_request(server: str) -> None:
    """Issue 40: a non-streamed request whose client left ran to its budget."""
    before = httpx.get(f"{server}/health").json()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server}/v1/chat/completions", json=LONG, timeout=1.5)  # NOTE: leaves after 1.5 s
    health = settled(server, before["aborted"] + 1)
    assert health["served"] == before["served"] and health["free_pages"] == health["pages"], health


@needs_smollm2
def test_ctrl_c_drains_saying_so_and_a_second_ends_streams_cleanly() -> None:
    proc, url, lines = start("--drain-timeout", "60")
    assert proc.stderr is not None
    try:
        ready(proc, lines)
        with httpx.stream(
            "POST", f"{url}/v1/chat/completions", json=LONG | {"stream": True}, timeout=60
        ) as r:
            events = r.iter_lines()
            got = [next(e for e in events if e.startswith("data: "))]
            proc.send_signal(signal.SIGINT)
            draining = next(line for line in proc.stderr if "stopping" in line)
            assert "draining 1 request(s) (1 running, 0 waiting) for up to 60 s" in draining, draining
            proc.send_signal(signal.SIGINT)
            got += [e for e in events if e.startswith("data: ")]
        rest = proc.stderr.read()
        assert proc.wait(timeout=30) == 0, rest
    finally:
        proc.kill()
    assert got[-1] == "data: [DONE]", got[-3:]
    assert json.loads(got[-2].removeprefix("data: "))["choices"][0]["finish_reason"] == "abort", got[-3:]
    assert "Traceback" not in rest and "CancelledError" not in rest and "graphrt serve: stopped" in rest, rest

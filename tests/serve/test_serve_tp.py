"""``graphrt serve --tp 2`` live on two CPU ranks (gloo): rank 0 serves, rank 1 follows.

The ranks are started as torchrun starts them (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` ...),
so the test can signal or kill each one. The model: a tiny random Llama checkpoint with a
word-level tokenizer (``t0 … t95``, text in and out). Concurrent clients (the official
``openai`` client, streamed and not) get the greedy replies ``LLM.generate`` gives on one
rank, eagerly (tests/parallel/test_tp_checkpoints: TP=2 logits within 1e-4 of TP=1, greedy
tokens equal). A refused request (400) leaves the followers alone; the server idles past the
group's timeout (``GRAPHRT_TP_TIMEOUT``, short here) and serves again; Ctrl-C reaching every
rank stops both with exit code 0. Rank 0 killed: rank 1 exits 1 naming rank 0, within the
timeout; rank 1 killed: rank 0 stops serving and exits 1.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("transformers")

from tests.parallel.test_tp_load import make_checkpoint  # noqa: E402
from tests.serve.test_serve import free_port  # noqa: E402
from tests.support.hf_util import save_word_tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 2.0  # NOTE: the group's timeout: the heartbeat comes every 0.5 s
SIZES = {"max_batch_size": 4, "max_context_len": 64}
NEW = 6
TEXTS = ["t1 t2 t3", "t7 t8 t9 t10 t11", "t40", "t5 t5 t5 t5"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = make_checkpoint(
        tmp_path_factory.mktemp("serve_tp"), "Llama", {"num_attention_heads": 4, "num_key_value_heads": 2}
    )
    save_word_tokenizer(path, 96)
    return path


class Ranks:
    """Two ``graphrt serve --tp 2`` processes; each one's stderr goes to a file."""

    def __init__(self, checkpoint: Path, logs: Path) -> None:
        self.port, master = free_port(), free_port()
        self.logs = [logs / f"rank{r}.err" for r in range(2)]
        cmd = [sys.executable, "-m", "graphrt", "serve", "--model", str(checkpoint), "--tp", "2"]
        cmd += ["--device", "cpu", "--port", str(self.port), "--max-batch-size", "4"]
        cmd += ["--max-context-len", "64", "--served-model-name", "m"]  # NOTE: the id clients send
        env = os.environ | {
            "PYTHONPATH": str(ROOT),
            "WORLD_SIZE": "2",
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(master),
            "GRAPHRT_TP_TIMEOUT": str(TIMEOUT_S),
            "OMP_NUM_THREADS": "1",
        }
        self.procs = [
            subprocess.Popen(
                cmd, env=env | {"RANK": str(r), "LOCAL_RANK": str(r)}, stderr=log.open("w"), text=True
            )
            for r, log in enumerate(self.logs)
        ]

    def err(self, rank: int) -> str:
        return self.logs[rank].read_text()

    def wait_ready(self, deadline_s: float = 120.0) -> None:
        end = time.monotonic() + deadline_s
        while "ready in" not in self.err(0):
            assert all(p.poll() is None for p in self.procs), self.err(0) + self.err(1)
            assert time.monotonic() < end, f"not ready in {deadline_s} s: {self.err(0)}"
            time.sleep(0.1)

    def exit_code(self, rank: int, within_s: float) -> int:
        try:
            return self.procs[rank].wait(timeout=within_s)
        except subprocess.TimeoutExpired:
            pytest.fail(f"rank {rank} still runs {within_s} s on (a hang): {self.err(rank)}")

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.fixture
def ranks(checkpoint: Path, tmp_path: Path) -> Iterator[Ranks]:
    ranks = Ranks(checkpoint, tmp_path)
    try:
        yield ranks
    finally:
        ranks.kill()


def ask(client: object, text: str, stream: bool) -> str:
    args = {"model": "m", "prompt": text, "max_tokens": NEW, "temperature": 0, "stream": stream}
    reply = client.completions.create(**args)  # type: ignore[attr-defined]
    return "".join(c.choices[0].text for c in reply) if stream else reply.choices[0].text


def replies(client: object) -> list[str]:
    """Every text at once, half of them streamed."""
    with ThreadPoolExecutor(len(TEXTS)) as pool:
        return list(pool.map(lambda i: ask(client, TEXTS[i], i % 2 == 1), range(len(TEXTS))))


def test_tp2_server_answers_as_tp1_idles_past_the_timeout_and_stops(ranks: Ranks, checkpoint: Path) -> None:
    from graphrt import LLM

    llm = LLM(checkpoint, device="cpu", use_graphs=False, **SIZES)  # NOTE: while the ranks start
    want = [c.text for c in llm.generate(TEXTS, max_new_tokens=NEW)]
    ranks.wait_ready()
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{ranks.port}/v1", api_key="unused", max_retries=0)
    assert replies(client) == want
    with pytest.raises(openai.BadRequestError, match="exceeds max_context_len 64"):
        client.completions.create(model="m", prompt="t1 t2", max_tokens=100)
    time.sleep(2.5 * TIMEOUT_S)  # NOTE: idle: only heartbeats reach rank 1
    assert all(p.poll() is None for p in ranks.procs), ranks.err(1)
    assert replies(client) == want
    health = httpx.get(f"http://127.0.0.1:{ranks.port}/health").json()
    assert (health["alive"], health["served"], health["errors"]) == (True, 2 * len(TEXTS), 0)
    for p in ranks.procs:  # NOTE: a terminal's Ctrl-C reaches every rank; rank 0 leads
        p.send_signal(signal.SIGINT)
    codes = [ranks.exit_code(r, 20.0) for r in range(2)]
    assert codes == [0, 0], ranks.err(0) + ranks.err(1)
    assert "graphrt serve: stopped" in ranks.err(0)
    assert "Traceback" not in ranks.err(0) + ranks.err(1)


def test_rank0_killed_the_follower_exits_naming_it(ranks: Ranks) -> None:
    ranks.wait_ready()
    ranks.procs[0].kill()
    assert ranks.exit_code(1, TIMEOUT_S + 10.0) == 1
    err = ranks.err(1)
    assert "graphrt serve: rank 1 of 2: lost rank 0" in err and "from rank 0" in err, err
    assert "Traceback" not in err, err


def test_follower_killed_rank0_stops_serving(ranks: Ranks) -> None:
    ranks.wait_ready()
    ranks.procs[1].kill()
    assert ranks.exit_code(0, 2 * TIMEOUT_S + 15.0) == 1
    err = ranks.err(0)
    assert "graphrt serve: stopped, the TP group broke" in err, err

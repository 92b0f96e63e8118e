"""The in-process OpenAI server the surface tests share (one per test package run): SmolLM2 on
the CPU with graphs, uvicorn in a thread, under the model id ``tiny-smol``."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.serve.test_serve import free_port

NAME = "tiny-smol"
SKY = "The sky is"


@pytest.fixture(scope="package")
def app_llm() -> Iterator[tuple[str, Any]]:
    """The server's URL and its LLM."""
    uvicorn = pytest.importorskip("uvicorn")
    from graphrt import LLM
    from graphrt.serve.app import build_app
    from graphrt.serve.loop import EngineLoop

    llm = LLM("smollm2", device="cpu", max_batch_size=4, max_context_len=256)
    # NOTE: the reference replies, before the engine thread owns the engine
    llm.expected = {  # type: ignore[attr-defined]
        "logprobs": llm.generate(SKY, max_new_tokens=4, logprobs=3)[0],
        "chat": llm.chat([{"role": "user", "content": "Hi"}], max_new_tokens=4, logprobs=2)[0],
    }
    loop = EngineLoop(llm.replies)
    port = free_port()
    config = uvicorn.Config(build_app(llm, loop, NAME), host="127.0.0.1", port=port, log_level="error")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}", llm
    server.should_exit = True
    thread.join(30)


@pytest.fixture(scope="package")
def url(app_llm: tuple[str, Any]) -> str:
    return app_llm[0]


@pytest.fixture(scope="package")
def client(url: str) -> Any:
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)

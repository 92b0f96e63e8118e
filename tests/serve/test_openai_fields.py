"""Log-probabilities, ``/metrics`` and ``response_format`` through the official ``openai``
client against the shared in-process server (tests/serve/conftest.py)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.serve.conftest import NAME, SKY
from tests.tools.test_cli_generate import needs_smollm2

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")


@needs_smollm2
def test_completion_logprobs_are_the_engines(client: Any, app_llm: tuple[str, Any]) -> None:
    want = app_llm[1].expected["logprobs"]
    reply = client.completions.create(model=NAME, prompt=SKY, max_tokens=4, temperature=0, logprobs=3)
    lp = reply.choices[0].logprobs
    assert len(lp.token_logprobs) == len(want.token_ids) == len(lp.top_logprobs) == len(lp.tokens)
    for i, entry in enumerate(want.logprobs):
        assert lp.token_logprobs[i] == pytest.approx(entry.logprob, abs=1e-5)
        assert len(lp.top_logprobs[i]) <= 3 and entry.top_ids[0] == entry.token  # NOTE: greedy: top 1
        assert max(lp.top_logprobs[i].values()) == pytest.approx(lp.token_logprobs[i], abs=1e-6)
    assert "".join(lp.tokens) == reply.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    chunks = client.completions.create(
        model=NAME, prompt=SKY, max_tokens=4, temperature=0, logprobs=3, stream=True
    )
    streamed = [
        v for c in chunks if c.choices and c.choices[0].logprobs for v in c.choices[0].logprobs.token_logprobs
    ]
    assert streamed == pytest.approx(lp.token_logprobs, abs=1e-6)


@needs_smollm2
def test_chat_logprobs_and_their_bounds(client: Any, app_llm: tuple[str, Any]) -> None:
    want = app_llm[1].expected["chat"]
    messages = [{"role": "user", "content": "Hi"}]
    reply = client.chat.completions.create(
        model=NAME, messages=messages, max_tokens=4, temperature=0, logprobs=True, top_logprobs=2
    )
    content = reply.choices[0].logprobs.content
    assert [c.logprob for c in content] == pytest.approx([e.logprob for e in want.logprobs], abs=1e-5)
    assert all(len(c.top_logprobs) == 2 and c.top_logprobs[0].token == c.token for c in content)
    plain = client.chat.completions.create(model=NAME, messages=messages, max_tokens=2, temperature=0)
    assert plain.choices[0].logprobs is None
    for extra, field in (
        ({"logprobs": True, "top_logprobs": 50}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
    ):
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model=NAME, messages=messages, max_tokens=2, **extra)
        assert err.value.body["param"] == field, err.value.body
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=NAME, prompt=SKY, max_tokens=2, logprobs=1, echo=True)
    assert err.value.body["param"] == "echo"


def _gauge(text: str, name: str) -> float:
    line = next(x for x in text.splitlines() if x.startswith(f'{name}{{model_name="{NAME}"}}'))
    return float(line.rsplit(" ", 1)[1])


@needs_smollm2
def test_metrics_gauges_move_with_load(url: str) -> None:
    before = httpx.get(f"{url}/metrics").text
    assert _gauge(before, "graphrt:num_requests_running") == 0.0
    ask = "Write a very long story about a dragon, in many paragraphs."
    body = {"model": NAME, "messages": [{"role": "user", "content": ask}], "max_tokens": 200, "stream": True}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        during = httpx.get(f"{url}/metrics").text
    for prefix in ("graphrt", "vllm"):  # NOTE: the model-server protocol's names too
        assert _gauge(during, f"{prefix}:num_requests_running") == 1.0
        assert 0.0 < _gauge(during, f"{prefix}:kv_cache_usage_perc") <= 1.0
        assert _gauge(during, f"{prefix}:num_requests_waiting") == 0.0
    deadline = time.monotonic() + 30
    while _gauge(after := httpx.get(f"{url}/metrics").text, "graphrt:num_requests_running"):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert _gauge(after, "graphrt:kv_cache_usage_perc") == 0.0
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
    reply = client.completions.create(model=NAME, prompt=SKY, max_tokens=3, temperature=0)
    done = httpx.get(f"{url}/metrics").text
    grew = _gauge(done, "graphrt:generation_tokens_total") - _gauge(after, "graphrt:generation_tokens_total")
    assert grew == reply.usage.completion_tokens
    prompts = _gauge(done, "graphrt:prompt_tokens_total") - _gauge(after, "graphrt:prompt_tokens_total")
    assert prompts == reply.usage.prompt_tokens
    ttft = _gauge(done, "graphrt:time_to_first_token_seconds_count")
    assert ttft >= 1 and _gauge(done, "graphrt:e2e_request_latency_seconds_count") >= 1


@needs_smollm2
def test_a_json_schema_reply_parses_and_validates(client: Any) -> None:
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 24},
            "country": {"type": "string", "maxLength": 24},
        },
        "required": ["city", "country"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "place", "schema": schema}}
    messages = [{"role": "user", "content": "Name the capital of France as JSON."}]
    reply = client.chat.completions.create(
        model=NAME, messages=messages, max_tokens=40, temperature=0, response_format=fmt
    )
    data = json.loads(reply.choices[0].message.content)
    assert set(data) == {"city", "country"} and reply.choices[0].finish_reason == "stop", data
    assert all(isinstance(v, str) and len(v) <= 24 for v in data.values())
    sampled = client.chat.completions.create(
        model=NAME, messages=messages, max_tokens=40, temperature=1.0, seed=5, n=2, response_format=fmt
    )
    for choice in sampled.choices:
        assert set(json.loads(choice.message.content)) == {"city", "country"}
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objec"}}}
    for wrong in (bad, {"type": "xml"}):
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model=NAME, messages=messages, max_tokens=4, response_format=wrong)
        assert err.value.body["param"] == "response_format", err.value.body

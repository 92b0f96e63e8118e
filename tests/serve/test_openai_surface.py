"""The OpenAI surface past plain replies, through the official ``openai`` client: nothing ignored
(unsupported fields and unknown models refused by name), every error in OpenAI's shape, the
informational routes, ``echo``, ``n`` choices and seeds.

The app runs in this process (tests/serve/conftest.py: uvicorn in a thread, SmolLM2 on the CPU
with graphs) under the model id ``tiny-smol`` (``--served-model-name``).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.serve.conftest import NAME
from tests.tools.test_cli_generate import needs_smollm2

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")


def _openai_error(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    return error


@needs_smollm2
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tools", [{"type": "function", "function": {"name": "f", "parameters": {}}}]),
        ("logit_bias", {"50256": -100}),
        ("best_of", 3),
        ("suffix", "the end"),
        ("functions", [{"name": "f"}]),
        ("min_tokens", 3),  # NOTE: vLLM's extension, not taken here
        ("tool_choice", "required"),
        ("temprature", 0.5),  # NOTE: a typo is unknown, not ignored
    ],
)
def test_an_unsupported_field_is_refused_by_name(client: Any, field: str, value: Any) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=NAME, prompt="hi", max_tokens=2, extra_body={field: value})
    assert err.value.status_code == 400 and err.value.body["param"] == field, err.value.body
    assert field in err.value.body["message"]


@needs_smollm2
def test_fields_that_change_nothing_are_accepted(client: Any) -> None:
    quiet = {"user": "u-1", "logit_bias": {}, "best_of": 1, "tools": [], "stream_options": None}
    reply = client.chat.completions.create(
        model=NAME,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=2,
        temperature=0,
        extra_body=quiet,
    )
    assert reply.choices[0].finish_reason in ("stop", "length")


@needs_smollm2
def test_an_unknown_model_is_a_404(client: Any, url: str) -> None:
    with pytest.raises(openai.NotFoundError) as err:
        client.completions.create(model="gpt-4o", prompt="hi", max_tokens=2)
    assert err.value.body["code"] == "model_not_found" and "gpt-4o" in err.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "x"}])
    assert [m.id for m in client.models.list().data] == [NAME]
    assert client.models.retrieve(NAME).id == NAME
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")


@needs_smollm2
def test_every_error_has_openai_shape(url: str) -> None:
    assert _openai_error(httpx.get(f"{url}/v1/nowhere"), 404)["code"] == "not_found"
    assert _openai_error(httpx.get(f"{url}/v1/completions"), 405)["type"] == "invalid_request_error"
    headers = {"content-type": "application/json"}
    _openai_error(httpx.post(f"{url}/v1/completions", content=b"{not json", headers=headers), 400)
    bad_utf8 = b'{"model": "tiny-smol", "prompt": "\xff\xfe"}'
    _openai_error(httpx.post(f"{url}/v1/completions", content=bad_utf8, headers=headers), 400)
    wrong_type = {"model": NAME, "prompt": "hi", "max_tokens": "many"}
    error = _openai_error(httpx.post(f"{url}/v1/completions", json=wrong_type), 400)
    assert error["param"] == "max_tokens"
    for n in (0, 17):
        error = _openai_error(httpx.post(f"{url}/v1/completions", json={"prompt": "hi", "n": n}), 400)
        assert error["param"] == "n"


@needs_smollm2
def test_tokenize_detokenize_and_version(url: str, app_llm: tuple[str, Any]) -> None:
    llm = app_llm[1]
    out = httpx.post(f"{url}/tokenize", json={"model": NAME, "prompt": "Hello world"}).json()
    assert out["tokens"] == llm.tokenizer.encode("Hello world") and out["count"] == len(out["tokens"])
    assert out["max_model_len"] == 256
    chat = httpx.post(f"{url}/tokenize", json={"messages": [{"role": "user", "content": "Hi"}]}).json()
    assert chat["tokens"] == llm.tokenizer.encode_chat([{"role": "user", "content": "Hi"}])
    back = httpx.post(f"{url}/detokenize", json={"tokens": out["tokens"]}).json()
    assert back["prompt"] == "Hello world"
    error = _openai_error(httpx.post(f"{url}/detokenize", json={"tokens": [10**9]}), 400)
    assert error["param"] == "tokens"
    _openai_error(httpx.post(f"{url}/tokenize", json={"model": "other", "prompt": "x"}), 404)
    from graphrt import __version__

    assert httpx.get(f"{url}/version").json() == {"version": __version__}


@needs_smollm2
def test_echo_puts_the_prompt_before_the_reply(client: Any) -> None:
    plain = client.completions.create(model=NAME, prompt="The sky is", max_tokens=4, temperature=0)
    echoed = client.completions.create(
        model=NAME, prompt="The sky is", max_tokens=4, temperature=0, echo=True
    )
    assert echoed.choices[0].text == "The sky is" + plain.choices[0].text
    chunks = client.completions.create(
        model=NAME, prompt="The sky is", max_tokens=4, temperature=0, echo=True, stream=True
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == echoed.choices[0].text


@needs_smollm2
def test_n_choices_differ_and_repeat_with_a_seed(client: Any) -> None:
    args = {"model": NAME, "prompt": "My favourite animal is", "max_tokens": 6, "temperature": 1.0}
    first = client.completions.create(n=3, seed=7, **args)
    again = client.completions.create(n=3, seed=7, **args)
    texts = [c.text for c in sorted(first.choices, key=lambda c: c.index)]
    assert [c.index for c in sorted(first.choices, key=lambda c: c.index)] == [0, 1, 2]
    assert texts == [c.text for c in sorted(again.choices, key=lambda c: c.index)]
    assert len(set(texts)) > 1, texts
    # NOTE: choice 0 keeps the request's seed: it is the n=1 reply
    assert client.completions.create(n=1, seed=7, **args).choices[0].text == texts[0]
    assert 3 <= first.usage.completion_tokens <= 3 * 6  # NOTE: every choice's tokens
    streamed = client.completions.create(
        n=3, seed=7, stream=True, stream_options={"include_usage": True}, **args
    )
    pieces: dict[int, str] = {0: "", 1: "", 2: ""}
    usage = None
    for chunk in streamed:
        for c in chunk.choices:
            pieces[c.index] += c.text
        usage = chunk.usage or usage
    assert [pieces[i] for i in range(3)] == texts
    assert usage is not None and usage.completion_tokens == first.usage.completion_tokens

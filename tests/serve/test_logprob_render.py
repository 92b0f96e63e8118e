"""Log-probabilities rendered in OpenAI's wire shapes: each token's text and UTF-8 bytes (a
token decoded once, however often it is named), and an SSE event that parses back to the
object it was made of (floats exactly)."""

from __future__ import annotations

import json
from typing import Any

from graphrt.runtime.logprobs import TokenLogprobs
from graphrt.serve.choices import sse
from graphrt.serve.logprobs import ChoiceLogprobs, LogprobText
from graphrt.serve.protocol import Envelope

TEXTS = {3: " the", 5: "é", 8: "\ufffd", 13: "<|im_end|>"}


class Decoder:
    """A tokenizer's ``decode`` over :data:`TEXTS`, counting its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        assert not skip_special_tokens and len(ids) == 1
        self.calls += 1
        return TEXTS[ids[0]]


ENTRIES = [
    TokenLogprobs(3, -0.125, (3, 5), (-0.125, -2.75)),
    TokenLogprobs(5, -1.0000001192092896, (13, 5), (-0.5, -1.0000001192092896)),
    TokenLogprobs(8, -3.5, (), ()),
]


def _entry(token: int, logprob: float) -> dict[str, Any]:
    text = TEXTS[token]
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def test_chat_and_completion_shapes_name_each_tokens_text_and_bytes() -> None:
    decoder = Decoder()
    render = LogprobText(decoder)  # type: ignore[arg-type]
    want = {
        "content": [
            _entry(e.token, e.logprob)
            | {"top_logprobs": [_entry(t, v) for t, v in zip(e.top_ids, e.top_logprobs, strict=True)]}
            for e in ENTRIES
        ]
    }
    assert render.chat(ENTRIES) == want
    assert render.chat(ENTRIES) == want  # NOTE: from the cache now
    assert decoder.calls == len(TEXTS)
    choice = ChoiceLogprobs(render, chat=False, offset=2)
    assert choice(ENTRIES) == {
        "tokens": [" the", "é", "\ufffd"],
        "token_logprobs": [-0.125, -1.0000001192092896, -3.5],
        "top_logprobs": [{" the": -0.125, "é": -2.75}, {"<|im_end|>": -0.5, "é": -1.0000001192092896}, {}],
        "text_offset": [2, 6, 7],
    }
    assert choice.offset == 8


def test_an_sse_event_parses_back_to_its_chunk() -> None:
    render = LogprobText(Decoder())  # type: ignore[arg-type]
    chunk = Envelope("m", chat=True).chunk("é", index=1, logprobs=render.chat(ENTRIES))
    event = sse(chunk)
    assert event.startswith("data: ") and event.endswith("\n\n")
    assert json.loads(event[len("data: ") : -2]) == chunk
    assert "é" in event  # NOTE: UTF-8 text, not \\u escapes

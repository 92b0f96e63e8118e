"""OpenAI's wire format: request bodies checked field by field, responses, stream chunks, errors.

Requests are pydantic models (pydantic comes with FastAPI) in strict mode: a bool is not an
int, ``"16"`` is not a number and ``2.0`` is not a token id; text holding a lone UTF-16
surrogate is not text. A bad field becomes :class:`RequestError` naming it, answered as ``400``
in OpenAI's error shape. Responses are the
JSON objects OpenAI's clients parse (``text_completion``, ``chat.completion`` and their stream
chunks), built from a :class:`~graphrt.Completion` or one step's new text.
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from graphrt.step.sampling import MAX_LOGPROBS, MAX_TOP_K, SamplingParams
from graphrt.text.stream import stop_strings

#: Stop strings a request may give (OpenAI's API: "up to 4 sequences").
HTTP_MAX_STOPS = 4
#: The most choices (``n``) one request may ask for.
MAX_N = 16


def _unicode(text: str) -> str:
    """``text`` if it encodes as UTF-8; a lone surrogate (``"\\ud800"`` in JSON) is refused."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        char = f"U+{ord(text[err.start]):04X}"
        raise ValueError(f"a lone UTF-16 surrogate ({char}) at character {err.start} is not text") from None
    return text


#: A string field: valid Unicode (what a tokenizer can take).
Text = Annotated[str, AfterValidator(_unicode)]


class RequestError(ValueError):
    """A request the server refuses: ``param`` names the field (None: the request as a whole)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param, self.status = param, status

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": str(self), "type": kind, "param": self.param, "code": None}}


class SamplingFields(BaseModel):
    """What both endpoints take besides the prompt. Other fields are kept (``model_extra``)
    for :func:`graphrt.serve.fields.check_extra`, which refuses any that would change the reply."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=-1, le=MAX_TOP_K)  # NOTE: vLLM's extension; -1 and 0 keep every token
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    stop: Text | list[Text] | None = None
    n: int = Field(default=1, ge=1, le=MAX_N)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=10.0)  # NOTE: vLLM's extension
    response_format: dict[str, Any] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None

    def sampling(self) -> SamplingParams:
        """The request's ``SamplingParams`` (its seed random unless given)."""
        return SamplingParams(
            self.temperature,
            max(self.top_k, 0),
            self.top_p,
            self.min_p,
            self.seed,
            logprobs=self.top_count(),
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty,
        )

    def top_count(self) -> int | None:
        """Top log-probabilities asked per token (None: no log-probabilities)."""
        return None

    def stops(self) -> tuple[str, ...]:
        try:
            return stop_strings(self.stop, HTTP_MAX_STOPS)
        except ValueError as err:
            raise RequestError(str(err), "stop") from err

    @property
    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))


class CompletionRequest(SamplingFields):
    """``POST /v1/completions``: one prompt, as text or token ids."""

    prompt: Text | list[int] | list[Text] | list[list[int]]
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)

    def top_count(self) -> int | None:
        if self.logprobs is not None and self.echo:
            raise RequestError("echo with logprobs (the prompt's log-probabilities) is not supported", "echo")
        return self.logprobs

    def single(self) -> str | list[int]:
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], str | list):
            if len(p) != 1:
                raise RequestError(f"{len(p)} prompts: send one prompt per request", "prompt")
            p = p[0]
        if not p:
            raise RequestError("prompt is empty", "prompt")
        return p  # type: ignore[return-value]


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True)

    type: Literal["text"]
    text: Text


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[TextPart] | None = None

    def plain(self) -> dict[str, str]:
        """The message as chat templates take it: ``{"role", "content"}`` with text content."""
        content = self.content
        text = "".join(p.text for p in content) if isinstance(content, list) else content or ""
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class ChatRequest(SamplingFields):
    """``POST /v1/chat/completions``."""

    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)

    def top_count(self) -> int | None:
        if self.top_logprobs is not None and not self.logprobs:
            raise RequestError("top_logprobs needs logprobs: true", "top_logprobs")
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def budget(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


def sampling_error(err: ValueError | TypeError) -> RequestError:
    """``SamplingParams``' complaint (``SamplingParams.top_p = ...``) naming the field."""
    text = str(err)
    field = text.split("SamplingParams.", 1)[1].split(" ", 1)[0] if "SamplingParams." in text else None
    return RequestError(text, field)


#: A ``loc`` part naming a member of a union (``str``, ``list[int]``, ``function-after[...]``).
_UNION_TAG = re.compile(r"^(str|int|float|bool|list|dict|none)$|[\[\]-]")


def validation_error(errors: list[dict[str, Any]]) -> RequestError:
    """pydantic's first error as one message naming the field (``messages.0.role``); of a
    union's errors, a bad value (a lone surrogate) before "not this type"."""
    first = next((e for e in errors if not str(e.get("type", "")).endswith("_type")), errors[0])
    if first.get("type") == "json_invalid":
        return RequestError(f"the request body is not valid JSON: {first.get('msg', '')}")
    loc = [str(p) for p in first.get("loc", ()) if p != "body" and not _UNION_TAG.search(str(p))]
    field = ".".join(loc) or None
    return RequestError(f"{field or 'body'}: {first.get('msg', 'invalid')}", field)


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


class Envelope:
    """The id, timestamp, model and kind shared by one response and all its chunks."""

    def __init__(self, model: str, chat: bool) -> None:
        self.chat, self.model = chat, model
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())

    def _object(self, kind: str, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        } | extra

    def _choice(
        self, text: str | None, finish: str | None, first: bool = False, index: int = 0, logprobs: Any = None
    ) -> dict[str, Any]:
        if not self.chat:
            return {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish}
        delta = ({"role": "assistant"} if first else {}) | ({"content": text} if text is not None else {})
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}

    def whole(
        self,
        text: str | list[str],
        finish: str | list[str],
        prompt_tokens: int,
        completion_tokens: int,
        logprobs: list[Any] | None = None,
    ) -> dict[str, Any]:
        """The non-streamed response: one choice, or (lists) one per choice, in order."""
        texts = [text] if isinstance(text, str) else text
        finishes = [finish] if isinstance(finish, str) else finish
        choices = []
        for i, (t, f) in enumerate(zip(texts, finishes, strict=True)):
            lp = logprobs[i] if logprobs else None
            if self.chat:
                message = {"role": "assistant", "content": t}
                choices.append({"index": i, "message": message, "logprobs": lp, "finish_reason": f})
            else:
                choices.append(self._choice(t, f, index=i, logprobs=lp))
        kind = "chat.completion" if self.chat else "text_completion"
        return self._object(kind, choices, usage=usage(prompt_tokens, completion_tokens))

    def chunk(
        self,
        text: str | None,
        finish: str | None = None,
        first: bool = False,
        index: int = 0,
        logprobs: Any = None,
    ) -> dict[str, Any]:
        """One stream chunk of choice ``index``: new ``text``, the ``finish`` reason on the last one."""
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return self._object(kind, [self._choice(text, finish, first, index, logprobs)])

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        """The extra last chunk of ``stream_options.include_usage``: no choices, the usage."""
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return self._object(kind, [], usage=usage(prompt_tokens, completion_tokens))

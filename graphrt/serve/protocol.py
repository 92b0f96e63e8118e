"""OpenAI's wire format: request bodies checked field by field, responses, stream chunks, errors.

Requests are pydantic models (pydantic comes with FastAPI); a bad field becomes
:class:`RequestError` naming it, answered as ``400`` in OpenAI's error shape. Responses are the
JSON objects OpenAI's clients parse (``text_completion``, ``chat.completion`` and their stream
chunks), built from a :class:`~graphrt.Completion` or one step's new text.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from graphrt.step.sampling import MAX_LOGPROBS, SamplingParams

#: The most choices (``n``) one request may ask for.
MAX_N = 16


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

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=-1)  # NOTE: vLLM's extension; -1 and 0 keep every token
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    stop: str | list[str] | None = None
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
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(not s for s in stops):
            raise RequestError("stop strings must be non-empty", "stop")
        return tuple(stops)

    @property
    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))


class CompletionRequest(SamplingFields):
    """``POST /v1/completions``: one prompt, as text or token ids."""

    prompt: str | list[int] | list[str] | list[list[int]]
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
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None

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


def validation_error(errors: list[dict[str, Any]]) -> RequestError:
    """pydantic's first error as one message naming the field (``messages.0.role``)."""
    first = errors[0]
    if first.get("type") == "json_invalid":
        return RequestError(f"the request body is not valid JSON: {first.get('msg', '')}")
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
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

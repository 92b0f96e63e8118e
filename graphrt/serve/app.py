"""The OpenAI-compatible HTTP app (FastAPI): completions and chat, streamed (SSE) or not.

Every request becomes a :class:`~graphrt.serve.loop.Job` of the one engine thread; its updates
come back through an asyncio queue fed with ``call_soon_threadsafe``. A client that goes away
(a closed stream, or a dropped connection while a whole reply is awaited) cancels its job,
which frees the request's row and KV pages at the engine's next pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse

from graphrt.llm import LLM
from graphrt.replies import Update
from graphrt.serve.guard import MAX_BODY_BYTES, Guard
from graphrt.serve.loop import EngineLoop, Job, ShuttingDown
from graphrt.serve.protocol import (
    ChatRequest,
    CompletionRequest,
    Envelope,
    RequestError,
    SamplingFields,
    sampling_error,
    validation_error,
)
from graphrt.text.tokenizer import Tokenizer

#: Seconds between checks that the client of a non-streamed reply is still there.
DISCONNECT_POLL_S = 0.5


def _error(err: RequestError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status)


class Served:
    """A job on the engine thread and the asyncio queue its updates arrive in."""

    def __init__(self, loop: EngineLoop, prompt: list[int], budget: int, fields: SamplingFields) -> None:
        try:
            sampling = fields.sampling()
        except RequestError:
            raise
        except (ValueError, TypeError) as err:
            raise sampling_error(err) from err
        stops = fields.stops()
        self.queue: asyncio.Queue[Update | Exception] = asyncio.Queue()
        aio = asyncio.get_running_loop()

        def deliver(item: Update | Exception) -> None:
            # NOTE: a closed event loop (shutdown) raises RuntimeError: nobody is waiting then
            with contextlib.suppress(RuntimeError):
                aio.call_soon_threadsafe(self.queue.put_nowait, item)

        self.loop = loop
        self.job = Job(prompt, budget, sampling, stops, deliver)
        loop.submit(self.job)

    async def next(self) -> Update:
        item = await self.queue.get()
        if isinstance(item, Exception):
            if isinstance(item, ShuttingDown):
                raise item
            if isinstance(item, ValueError | TypeError):  # NOTE: the engine refused the request
                raise RequestError(str(item), "prompt" if "prompt" in str(item) else None) from item
            raise RequestError(str(item), None, status=503) from item
        return item

    def cancel(self) -> None:
        self.loop.cancel(self.job)


async def _whole(served: Served, envelope: Envelope, request: Request) -> JSONResponse:
    text: list[str] = []
    checked = time.monotonic()
    while True:
        try:
            update: Update | None = await asyncio.wait_for(served.next(), DISCONNECT_POLL_S)
        except asyncio.TimeoutError:
            update = None
        except ShuttingDown as err:
            raise RequestError(str(err), None, status=503) from err
        # NOTE: by the clock, not only when idle: a reply whose tokens keep coming is checked too
        if update is None or time.monotonic() - checked >= DISCONNECT_POLL_S:
            checked = time.monotonic()
            if await request.is_disconnected():
                served.cancel()
                return JSONResponse({}, status_code=499)
        if update is None:
            continue
        text.append(update.text)
        if update.done is not None:
            d = update.done
            return JSONResponse(
                envelope.whole("".join(text), d.finish_reason, d.prompt_tokens, d.completion_tokens)
            )


def _sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def _stream(served: Served, envelope: Envelope, first: Update, usage: bool) -> AsyncIterator[str]:
    """SSE chunks; a client that leaves closes this generator, which cancels the job."""
    try:
        if envelope.chat:
            yield _sse(envelope.chunk("", first=True))
        update = first
        while True:
            if update.text:
                yield _sse(envelope.chunk(update.text))
            if update.done is not None:
                break
            update = await served.next()
        d = update.done
        yield _sse(envelope.chunk(None if envelope.chat else "", d.finish_reason))
        if usage:
            yield _sse(envelope.usage_chunk(d.prompt_tokens, d.completion_tokens))
        yield "data: [DONE]\n\n"
    except ShuttingDown:  # NOTE: Ctrl-C's drain ran out: end the stream as a stream ends
        yield _sse(envelope.chunk(None if envelope.chat else "", "abort"))
        yield "data: [DONE]\n\n"
    except RequestError as err:  # NOTE: the engine failed mid-stream: say so in the stream
        yield _sse(err.body())
    finally:
        served.cancel()  # NOTE: a no-op once the reply has ended


async def _respond(
    request: Request, llm: LLM, loop: EngineLoop, fields: SamplingFields, prompt: list[int], budget: int
) -> Any:
    envelope = Envelope(llm.name, chat=isinstance(fields, ChatRequest))
    served = Served(loop, prompt, budget, fields)
    if not fields.stream:
        return await _whole(served, envelope, request)
    try:
        first = await served.next()  # NOTE: a refusal is still a plain 400, before any SSE
    except ShuttingDown as err:
        served.cancel()
        raise RequestError(str(err), None, status=503) from err
    except BaseException:
        served.cancel()
        raise
    headers = {"Cache-Control": "no-cache"}
    body = _stream(served, envelope, first, fields.include_usage)
    return StreamingResponse(body, media_type="text/event-stream", headers=headers)


def _chat_ids(tokenizer: Tokenizer, body: ChatRequest, allow_special: bool) -> list[int]:
    """The messages' ids through the chat template; content holding a special token is refused
    unless ``allow_special``, and a template's refusal names ``messages``."""
    messages = [m.plain() for m in body.messages]
    for i, m in enumerate(messages if not allow_special else ()):
        if (special := tokenizer.special_in(m["content"])) is not None:
            raise RequestError(
                f"messages.{i}.content holds the chat template's special token {special!r}"
                " (graphrt serve --allow-special-tokens lets it through)",
                f"messages.{i}.content",
            )
    try:
        return tokenizer.encode_chat(messages)
    except ValueError as err:  # NOTE: the chat template refused the messages
        raise RequestError(str(err), "messages") from err


def build_app(
    llm: LLM,
    loop: EngineLoop,
    *,
    api_key: str | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    allow_special_tokens: bool = False,
) -> FastAPI:
    """The app serving ``llm`` through ``loop`` (started and stopped with the app).

    ``api_key``: every ``/v1`` request needs ``Authorization: Bearer <api_key>`` (None: open).
    ``max_body_bytes``: larger request bodies get ``413``. ``allow_special_tokens``: chat
    content may hold the chat template's special tokens (``<|im_start|>``...), which then act
    as such (a fake turn); by default such content is refused with a ``400``.
    """
    tokenizer = llm.tokenizer
    if tokenizer is None:
        raise ValueError(f"{llm.name} has no tokenizer: graphrt serve needs text in and out")

    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loop.start()
        yield
        await asyncio.to_thread(loop.stop)

    app = FastAPI(title="graphrt", lifespan=lifespan)  # type: ignore[arg-type]
    app.add_middleware(Guard, max_body_bytes=max_body_bytes, api_key=api_key)  # type: ignore[arg-type]

    @app.exception_handler(RequestError)
    async def refused(request: Request, err: RequestError) -> JSONResponse:
        return _error(err)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        return _error(validation_error(list(err.errors())))

    # NOTE: tokenizing runs in a worker thread: a long prompt never holds the event loop
    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Any:
        prompt = body.single()
        ids = await asyncio.to_thread(tokenizer.encode, prompt) if isinstance(prompt, str) else list(prompt)
        return await _respond(request, llm, loop, body, ids, body.max_tokens or 16)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request) -> Any:
        ids = await asyncio.to_thread(_chat_ids, tokenizer, body, allow_special_tokens)
        budget = body.budget or max(llm.engine.max_context_len - len(ids), 1)
        return await _respond(request, llm, loop, body, ids, budget)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": llm.name, "object": "model", "created": 0, "owned_by": "graphrt"}
        return {"object": "list", "data": [card]}

    @app.get("/health")
    async def health() -> JSONResponse:
        stats = loop.stats
        body = {"status": "ok" if stats.alive else "stopped"} | dataclasses.asdict(stats)
        return JSONResponse(body, status_code=200 if stats.alive else 503)

    return app

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
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse

from graphrt.llm import LLM
from graphrt.replies import Update
from graphrt.serve.loop import EngineLoop, Job
from graphrt.serve.protocol import (
    ChatRequest,
    CompletionRequest,
    Envelope,
    RequestError,
    SamplingFields,
    sampling_error,
    validation_error,
)

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
        self.queue: asyncio.Queue[Update | Exception] = asyncio.Queue()
        aio = asyncio.get_running_loop()

        def deliver(item: Update | Exception) -> None:
            # NOTE: a closed event loop (shutdown) raises RuntimeError: nobody is waiting then
            with contextlib.suppress(RuntimeError):
                aio.call_soon_threadsafe(self.queue.put_nowait, item)

        self.loop = loop
        self.job = Job(prompt, budget, sampling, fields.stops(), deliver)
        loop.submit(self.job)

    async def next(self) -> Update:
        item = await self.queue.get()
        if isinstance(item, Exception):
            if isinstance(item, ValueError | TypeError):  # NOTE: the engine refused the request
                raise RequestError(str(item), "prompt" if "prompt" in str(item) else None) from item
            raise RequestError(str(item), None, status=503) from item
        return item

    def cancel(self) -> None:
        self.loop.cancel(self.job)


async def _whole(served: Served, envelope: Envelope, request: Request) -> JSONResponse:
    text: list[str] = []
    while True:
        try:
            update = await asyncio.wait_for(served.next(), DISCONNECT_POLL_S)
        except asyncio.TimeoutError:
            if await request.is_disconnected():
                served.cancel()
                return JSONResponse({}, status_code=499)
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
    except BaseException:
        served.cancel()
        raise
    headers = {"Cache-Control": "no-cache"}
    body = _stream(served, envelope, first, fields.include_usage)
    return StreamingResponse(body, media_type="text/event-stream", headers=headers)


def build_app(llm: LLM, loop: EngineLoop) -> FastAPI:
    """The app serving ``llm`` through ``loop`` (started and stopped with the app)."""
    tokenizer = llm.tokenizer
    if tokenizer is None:
        raise ValueError(f"{llm.name} has no tokenizer: graphrt serve needs text in and out")

    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loop.start()
        yield
        await asyncio.to_thread(loop.stop)

    app = FastAPI(title="graphrt", lifespan=lifespan)  # type: ignore[arg-type]

    @app.exception_handler(RequestError)
    async def refused(request: Request, err: RequestError) -> JSONResponse:
        return _error(err)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        return _error(validation_error(list(err.errors())))

    def guarded(fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except RequestError:
            raise
        except ValueError as err:  # NOTE: the chat template refused the messages
            raise RequestError(str(err), "messages") from err

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Any:
        prompt = body.single()
        ids = tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        return await _respond(request, llm, loop, body, ids, body.max_tokens or 16)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request) -> Any:
        ids = guarded(lambda: tokenizer.encode_chat([m.plain() for m in body.messages]))
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

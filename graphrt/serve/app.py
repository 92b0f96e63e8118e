"""The OpenAI-compatible HTTP app (FastAPI): completions and chat, streamed (SSE) or not.

Every request becomes a :class:`~graphrt.serve.loop.Job` of the one engine thread; its updates
come back through an asyncio queue fed with ``call_soon_threadsafe``. A client that goes away
(a closed stream, or a dropped connection while a whole reply is awaited) cancels its job,
which frees the request's row and KV pages at the engine's next pass.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from graphrt.llm import LLM
from graphrt.serve.choices import Ask, Served, stream, whole
from graphrt.serve.errors import install as install_errors
from graphrt.serve.fields import check_extra, check_model
from graphrt.serve.formats import Formats
from graphrt.serve.info import info_routes
from graphrt.serve.logprobs import LogprobText
from graphrt.serve.loop import EngineLoop
from graphrt.serve.metrics import Metrics
from graphrt.serve.protocol import (
    ChatRequest,
    CompletionRequest,
    Envelope,
    RequestError,
    SamplingFields,
    sampling_error,
)


def _ask(
    body: SamplingFields,
    prompt: list[int],
    budget: int,
    render: LogprobText,
    formats: Formats,
    echo: str = "",
) -> Ask:
    """The engine's side of ``body`` (its fields checked: nothing is ignored)."""
    check_extra(body)
    constraint = formats.constraint(body.response_format)
    try:
        sampling = body.sampling()
    except RequestError:
        raise
    except (ValueError, TypeError) as err:
        raise sampling_error(err) from err
    wanted = sampling.logprobs is not None
    return Ask(prompt, budget, sampling, body.stops(), body.n, echo, render if wanted else None, constraint)


async def _respond(
    request: Request, name: str, loop: EngineLoop, body: SamplingFields, ask: Ask, metrics: Metrics
) -> Any:
    envelope = Envelope(name, chat=isinstance(body, ChatRequest))
    served = Served(loop, ask, metrics)
    if not body.stream:
        return await whole(served, envelope, request)
    try:
        first = await served.next()  # NOTE: a refusal is still a plain 400, before any SSE
    except BaseException:
        served.cancel()
        raise
    headers = {"Cache-Control": "no-cache"}
    chunks = stream(served, envelope, first, body.include_usage)
    return StreamingResponse(chunks, media_type="text/event-stream", headers=headers)


def build_app(llm: LLM, loop: EngineLoop, served_model_name: str | None = None) -> FastAPI:
    """The app serving ``llm`` through ``loop`` (started and stopped with the app), under the
    model id ``served_model_name`` (default: the model as named)."""
    tokenizer = llm.tokenizer
    if tokenizer is None:
        raise ValueError(f"{llm.name} has no tokenizer: graphrt serve needs text in and out")
    name = served_model_name or llm.name
    render = LogprobText(tokenizer)
    metrics = Metrics(name)
    formats = Formats(tokenizer, llm.engine.model.vocab_size)

    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loop.start()
        yield
        await asyncio.to_thread(loop.stop)

    app = FastAPI(title="graphrt", lifespan=lifespan)  # type: ignore[arg-type]

    install_errors(app)

    def guarded(fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except RequestError:
            raise
        except ValueError as err:  # NOTE: the chat template refused the messages
            raise RequestError(str(err), "messages") from err

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Any:
        check_model(body.model, name)
        prompt = body.single()
        ids = tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        echo = (prompt if isinstance(prompt, str) else tokenizer.decode(ids)) if body.echo else ""
        ask = _ask(body, ids, body.max_tokens or 16, render, formats, echo)
        return await _respond(request, name, loop, body, ask, metrics)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request) -> Any:
        check_model(body.model, name)
        ids = guarded(lambda: tokenizer.encode_chat([m.plain() for m in body.messages]))
        budget = body.budget or max(llm.engine.max_context_len - len(ids), 1)
        return await _respond(request, name, loop, body, _ask(body, ids, budget, render, formats), metrics)

    app.include_router(info_routes(llm, name))

    @app.get("/health")
    async def health() -> JSONResponse:
        stats = loop.stats
        body = {"status": "ok" if stats.alive else "stopped"} | dataclasses.asdict(stats)
        return JSONResponse(body, status_code=200 if stats.alive else 503)

    @app.get("/metrics")
    async def scrape() -> Response:
        return Response(metrics.scrape(loop.stats), media_type=CONTENT_TYPE_LATEST)

    return app

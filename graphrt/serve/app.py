"""The OpenAI-compatible HTTP app (FastAPI): completions and chat, streamed (SSE) or not.

Every request becomes :mod:`~graphrt.serve.choices`' jobs on the one engine thread; their
updates come back through an asyncio queue fed by the engine loop's outbox. A client that goes
away (a closed stream, or a dropped connection while a whole reply is awaited) cancels its jobs,
which frees the requests' rows and KV pages at the engine's next pass. Tokenizing runs in a
worker thread, so a long prompt never holds the event loop; :class:`~graphrt.serve.guard.Guard`
bounds the body and checks the API key before any route runs.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from graphrt.llm import LLM
from graphrt.serve.choices import Ask, Served, stream, whole
from graphrt.serve.errors import install as install_errors
from graphrt.serve.fields import check_extra, check_model
from graphrt.serve.formats import Formats
from graphrt.serve.guard import MAX_BODY_BYTES, Guard
from graphrt.serve.info import info_routes
from graphrt.serve.logprobs import LogprobText
from graphrt.serve.loop import EngineLoop, ShuttingDown
from graphrt.serve.metrics import Metrics
from graphrt.serve.protocol import (
    ChatRequest,
    CompletionRequest,
    Envelope,
    RequestError,
    SamplingFields,
    sampling_error,
)
from graphrt.text.tokenizer import Tokenizer


@dataclass(frozen=True, slots=True)
class Serving:
    """What the text routes share: the model, its engine thread and the served model id."""

    llm: LLM
    loop: EngineLoop
    name: str
    tokenizer: Tokenizer
    render: LogprobText
    metrics: Metrics
    formats: Formats
    #: Chat content may hold the chat template's special tokens (``--allow-special-tokens``).
    allow_special_tokens: bool = False

    def ask(self, body: SamplingFields, prompt: list[int], budget: int, echo: str = "") -> Ask:
        """The engine's side of ``body`` (its fields checked: nothing is ignored)."""
        check_extra(body)
        constraint = self.formats.constraint(body.response_format)
        try:
            sampling = body.sampling()
        except RequestError:
            raise
        except (ValueError, TypeError) as err:
            raise sampling_error(err) from err
        render = self.render if sampling.logprobs is not None else None
        return Ask(prompt, budget, sampling, body.stops(), body.n, echo, render, constraint)

    def chat_ids(self, body: ChatRequest) -> list[int]:
        """The conversation's prompt ids; content holding a special token is refused unless
        :attr:`allow_special_tokens` (it would act as one: a fake turn)."""
        messages = [m.plain() for m in body.messages]
        for i, m in enumerate(messages if not self.allow_special_tokens else ()):
            if (special := self.tokenizer.special_in(m["content"])) is not None:
                raise RequestError(
                    f"messages.{i}.content holds the chat template's special token {special!r}"
                    " (graphrt serve --allow-special-tokens lets it through)",
                    f"messages.{i}.content",
                )
        return _guarded(lambda: self.tokenizer.encode_chat(messages))


def _guarded(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except RequestError:
        raise
    except ValueError as err:  # NOTE: the chat template refused the messages
        raise RequestError(str(err), "messages") from err


async def _respond(request: Request, serving: Serving, body: SamplingFields, ask: Ask) -> Any:
    envelope = Envelope(serving.name, chat=isinstance(body, ChatRequest))
    served = Served(serving.loop, ask, serving.metrics)
    if not body.stream:
        return await whole(served, envelope, request)
    try:
        first = await served.next()  # NOTE: a refusal is still a plain 400, before any SSE
    except ShuttingDown as err:
        served.cancel()
        raise RequestError(str(err), None, status=503) from err
    except BaseException:
        served.cancel()
        raise
    headers = {"Cache-Control": "no-cache"}
    chunks = stream(served, envelope, first, body.include_usage)
    return StreamingResponse(chunks, media_type="text/event-stream", headers=headers)


async def complete(serving: Serving, body: CompletionRequest, request: Request) -> Any:
    """``POST /v1/completions``."""
    check_model(body.model, serving.name)
    prompt, tokenizer = body.single(), serving.tokenizer
    ids = await asyncio.to_thread(tokenizer.encode, prompt) if isinstance(prompt, str) else list(prompt)
    echo = (prompt if isinstance(prompt, str) else tokenizer.decode(ids)) if body.echo else ""
    return await _respond(request, serving, body, serving.ask(body, ids, body.max_tokens or 16, echo))


async def chat(serving: Serving, body: ChatRequest, request: Request) -> Any:
    """``POST /v1/chat/completions``."""
    check_model(body.model, serving.name)
    ids = await asyncio.to_thread(serving.chat_ids, body)
    budget = body.budget or max(serving.llm.engine.max_context_len - len(ids), 1)
    return await _respond(request, serving, body, serving.ask(body, ids, budget))


def _status_routes(app: FastAPI, loop: EngineLoop, metrics: Metrics) -> None:
    """``/health`` (503 once the engine thread has stopped) and ``/metrics`` (Prometheus)."""

    @app.get("/health")
    async def health() -> JSONResponse:
        stats = loop.stats
        body = {"status": "ok" if stats.alive else "stopped"} | dataclasses.asdict(stats)
        return JSONResponse(body, status_code=200 if stats.alive else 503)

    @app.get("/metrics")
    async def scrape() -> Response:
        return Response(metrics.scrape(loop.stats), media_type=CONTENT_TYPE_LATEST)


def build_app(
    llm: LLM,
    loop: EngineLoop,
    served_model_name: str | None = None,
    *,
    api_key: str | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    allow_special_tokens: bool = False,
) -> FastAPI:
    """The app serving ``llm`` through ``loop`` (started and stopped with the app), under the
    model id ``served_model_name`` (default: the model as named).

    ``api_key``: every ``/v1`` request needs ``Authorization: Bearer <api_key>`` (None: open).
    ``max_body_bytes``: larger request bodies get ``413``. ``allow_special_tokens``: chat
    content may hold the chat template's special tokens (``<|im_start|>``...), which then act
    as such (a fake turn); by default such content is refused with a ``400``.
    """
    tokenizer = llm.tokenizer
    if tokenizer is None:
        raise ValueError(f"{llm.name} has no tokenizer: graphrt serve needs text in and out")
    name = served_model_name or llm.name
    formats = Formats(tokenizer, llm.engine.model.vocab_size)
    metrics = Metrics(name, speculative=llm.engine.spec is not None)
    serving = Serving(
        llm, loop, name, tokenizer, LogprobText(tokenizer), metrics, formats, allow_special_tokens
    )

    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loop.outbox.bind(asyncio.get_running_loop())
        loop.start()
        yield
        await asyncio.to_thread(loop.stop)

    app = FastAPI(title="graphrt", lifespan=lifespan)  # type: ignore[arg-type]
    app.add_middleware(Guard, max_body_bytes=max_body_bytes, api_key=api_key)  # type: ignore[arg-type]
    install_errors(app)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Any:
        return await complete(serving, body, request)

    @app.post("/v1/chat/completions")
    async def chats(body: ChatRequest, request: Request) -> Any:
        return await chat(serving, body, request)

    app.include_router(info_routes(llm, name))
    _status_routes(app, loop, metrics)
    return app

"""One HTTP request's ``n`` choices: a job each on the engine thread, answered whole or streamed.

Every choice is its own engine request (they batch together like any others); a sampled
request with a ``seed`` gives choice ``i`` the seed :func:`choice_seed` derives, so a fixed
seed answers the same ``n`` choices every time while the choices differ from each other.
Updates come back through one asyncio queue fed by the engine loop's outbox; a client that
goes away cancels every job, which frees their rows and KV pages at the engine's next pass.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi import Request
from fastapi.responses import JSONResponse, Response

from graphrt.replies import Update
from graphrt.serve.logprobs import ChoiceLogprobs, LogprobText
from graphrt.serve.loop import EngineLoop, Job, ShuttingDown
from graphrt.serve.metrics import Metrics, Timing
from graphrt.serve.protocol import Envelope, RequestError
from graphrt.step.sampling import MAX_SEED, SamplingParams

#: Seconds between checks that the client of a non-streamed reply is still there.
DISCONNECT_POLL_S = 0.5


def choice_seed(seed: int, index: int) -> int:
    """Choice ``index``'s seed from the request's ``seed`` (choice 0 keeps it)."""
    if index == 0:
        return seed
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % (MAX_SEED + 1)


def choice_params(sampling: SamplingParams | None, n: int) -> list[SamplingParams | None]:
    """Each choice's parameters: the seed derived per choice when one is given."""
    if sampling is None or sampling.seed is None or sampling.greedy:
        return [sampling] * n
    return [dataclasses.replace(sampling, seed=choice_seed(sampling.seed, i)) for i in range(n)]


@dataclass(frozen=True, slots=True)
class Ask:
    """What one request asks of the engine: prompt ids, budget, sampling, stop strings, ``n``;
    ``echo``: text put before each choice's reply (completions' ``echo``)."""

    prompt: list[int]
    budget: int
    sampling: SamplingParams | None
    stop: tuple[str, ...]
    n: int = 1
    echo: str = ""
    #: Renders log-probabilities (a request that asked for them), else None.
    render: LogprobText | None = None
    #: Makes each choice's grammar state (``response_format``), else None.
    constraint: Callable[[], Any] | None = None

    def logprobs(self, chat: bool) -> list[ChoiceLogprobs | None]:
        """Each choice's rendering of its log-probabilities (None: not asked for)."""
        render = self.render
        return [
            None if render is None else ChoiceLogprobs(render, chat, len(self.echo)) for _ in range(self.n)
        ]


class Served:
    """The ``n`` jobs of one request and the asyncio queue their updates arrive in, tagged with
    the choice's index."""

    def __init__(self, loop: EngineLoop, ask: Ask, metrics: Metrics | None = None) -> None:
        self.metrics, self.timing = metrics, Timing()
        self.queue: asyncio.Queue[tuple[int, Update | Exception]] = asyncio.Queue()
        self._held: tuple[int, Update | Exception] | None = None  # NOTE: taken, not yet used

        def deliver_to(i: int) -> Callable[[Update | Exception], None]:
            return lambda item: loop.outbox.put(self.queue, (i, item))

        self.loop, self.ask = loop, ask
        params = choice_params(ask.sampling, ask.n)
        self.jobs = [Job(ask.prompt, ask.budget, p, ask.stop, deliver_to(i)) for i, p in enumerate(params)]
        for job in self.jobs:
            job.constraint = ask.constraint() if ask.constraint is not None else None
        for job in self.jobs:
            loop.submit(job)

    async def next(self) -> tuple[int, Update]:
        """The next update of any choice (waiting for one); an engine's error is raised."""
        if self._held is not None:
            got, self._held = self._held, None
            return self._checked(*got)
        return self._checked(*(await self.queue.get()))

    def coalesce(self, i: int, update: Update) -> Update:
        """``update`` (choice ``i``'s) joined with the updates of the same choice queued behind
        it already: a stream that falls behind its engine sends one chunk for several steps'
        tokens (as vLLM's output collector merges them), so the per-chunk cost (the SSE event,
        its write, the client's parse) shrinks under load instead of piling up. Never waits."""
        while update.done is None:
            if self._held is None:
                if self.queue.empty():  # NOTE: the usual case, kept cheap: no QueueEmpty raised
                    break
                self._held = self.queue.get_nowait()
            j, item = self._held
            if j != i or isinstance(item, Exception):
                break
            self._held = None
            update = update.then(self._checked(j, item)[1])
        return update

    def _checked(self, i: int, item: Update | Exception) -> tuple[int, Update]:
        if isinstance(item, Exception):
            if isinstance(item, ShuttingDown):
                raise item
            if isinstance(item, ValueError | TypeError):  # NOTE: the engine refused the request
                raise RequestError(str(item), "prompt" if "prompt" in str(item) else None) from item
            raise RequestError(str(item), None, status=503) from item
        self.timing.saw(i, len(item.token_ids))
        return i, item

    def ended(self, prompt_tokens: int) -> None:
        """Every choice has ended: observe the request's latencies and token counts."""
        if self.metrics is not None:
            self.metrics.ended(self.timing, prompt_tokens)

    def cancel(self) -> None:
        for job in self.jobs:
            self.loop.cancel(job)


async def whole(served: Served, envelope: Envelope, request: Request) -> Response:
    """The non-streamed response once every choice has ended (499 if the client left, 503 if
    the server stopped first)."""
    n = served.ask.n
    text: list[list[str]] = [[served.ask.echo] for _ in range(n)]
    done: dict[int, Any] = {}
    checked = time.monotonic()
    while len(done) < n:
        try:
            got: tuple[int, Update] | None = await asyncio.wait_for(served.next(), DISCONNECT_POLL_S)
        except asyncio.TimeoutError:
            got = None
        except ShuttingDown as err:
            served.cancel()
            raise RequestError(str(err), None, status=503) from err
        # NOTE: by the clock, not only when idle: a reply whose tokens keep coming is checked too
        if got is None or time.monotonic() - checked >= DISCONNECT_POLL_S:
            checked = time.monotonic()
            if await request.is_disconnected():
                served.cancel()
                return JSONResponse({}, status_code=499)
        if got is None:
            continue
        i, update = got
        text[i].append(update.text)
        if update.done is not None:
            done[i] = update.done
    ends = [done[i] for i in range(n)]
    used = sum(d.completion_tokens for d in ends)
    served.ended(ends[0].prompt_tokens)
    render = served.ask.logprobs(envelope.chat)
    lp = [None if r is None else r(d.logprobs) for r, d in zip(render, ends, strict=True)]
    texts = ["".join(t) for t in text]
    body = envelope.whole(texts, [d.finish_reason for d in ends], ends[0].prompt_tokens, used, lp)
    return Response(orjson.dumps(body), media_type="application/json")  # NOTE: as sse's chunks


def sse(obj: dict[str, Any]) -> str:
    """One SSE event of ``obj`` as compact UTF-8 JSON.

    NOTE: orjson, as SGLang's server: the standard encoder formats every float through a
    Python call, which made a chunk holding log-probabilities cost several times a plain one
    on the thread that shares the interpreter with the engine's.
    """
    return f"data: {orjson.dumps(obj).decode()}\n\n"


async def stream(
    served: Served, envelope: Envelope, first: tuple[int, Update], usage: bool
) -> AsyncIterator[str]:
    """SSE chunks of every choice; a client that leaves closes this generator, which cancels
    the jobs."""
    n, ask = served.ask.n, served.ask
    ends: dict[int, Any] = {}
    try:
        for i in range(n):
            if envelope.chat:
                yield sse(envelope.chunk("", first=True, index=i))
            elif ask.echo:
                yield sse(envelope.chunk(ask.echo, index=i))
        i, update = first
        render = ask.logprobs(envelope.chat)
        while True:
            update = served.coalesce(i, update)
            lp = render[i](update.logprobs) if render[i] is not None else None
            if update.text or lp:
                yield sse(envelope.chunk(update.text, index=i, logprobs=lp))
            if update.done is not None:
                ends[i] = update.done
                yield sse(envelope.chunk(None if envelope.chat else "", update.done.finish_reason, index=i))
                if len(ends) == n:
                    break
            i, update = await served.next()
        served.ended(ends[0].prompt_tokens)
        if usage:
            used = sum(d.completion_tokens for d in ends.values())
            yield sse(envelope.usage_chunk(ends[0].prompt_tokens, used))
        yield "data: [DONE]\n\n"
    except ShuttingDown:  # NOTE: Ctrl-C's drain ran out: end every open choice as a stream ends
        for k in sorted(set(range(n)) - set(ends)):
            yield sse(envelope.chunk(None if envelope.chat else "", "abort", index=k))
        yield "data: [DONE]\n\n"
    except RequestError as err:  # NOTE: the engine failed mid-stream: say so in the stream
        yield sse(err.body())
    finally:
        served.cancel()  # NOTE: a no-op once the reply has ended

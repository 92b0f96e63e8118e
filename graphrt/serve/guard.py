"""The server's door, before any route runs: the request body's size and the API key.

:class:`Guard` is a plain ASGI middleware (it reads no body it does not have to): a body over
``max_body_bytes`` gets ``413`` as soon as its ``Content-Length`` says so, or as soon as the
bytes received pass the bound (a chunked upload), so a 10 MB prompt is never parsed nor
tokenized. With an ``api_key`` every ``/v1/...`` request needs ``Authorization: Bearer <key>``
(``401`` otherwise, in OpenAI's error shape, as vLLM and SGLang answer); ``/health`` stays open
for load balancers.
"""

from __future__ import annotations

import hmac
import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

#: The largest request body by default (``graphrt serve --max-body-mb``), in bytes.
MAX_BODY_BYTES = 4 * 2**20
#: The environment variable that gives the API key when ``--api-key`` is not given.
API_KEY_ENV = "GRAPHRT_API_KEY"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


def api_key_from(flag: str | None) -> str | None:
    """The API key: ``flag`` (``--api-key``) or ``$GRAPHRT_API_KEY``; None (no key) when neither."""
    key = flag if flag is not None else os.environ.get("GRAPHRT_API_KEY")
    return key or None


async def _answer(send: Send, status: int, message: str, code: str, param: str | None = None) -> None:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}}
    raw = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": raw})


class Guard:
    """ASGI middleware: body size bound and (optional) bearer API key; see the module docstring."""

    def __init__(self, app: App, *, max_body_bytes: int = MAX_BODY_BYTES, api_key: str | None = None) -> None:
        if max_body_bytes < 1:
            raise ValueError(f"max_body_bytes = {max_body_bytes}: allowed >= 1")
        self.app, self.limit, self.key = app, max_body_bytes, api_key

    def _authorized(self, scope: Scope) -> bool:
        if self.key is None or not str(scope.get("path", "")).startswith("/v1"):
            return True
        headers = dict(scope.get("headers") or [])
        given = headers.get(b"authorization", b"").decode("latin-1")
        scheme, _, token = given.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self.key.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if not self._authorized(scope):
            await _answer(
                send, 401, "a valid API key is needed: Authorization: Bearer <key>", "invalid_api_key"
            )
            return
        length = dict(scope.get("headers") or []).get(b"content-length", b"0")
        if length.isdigit() and int(length) > self.limit:
            await _answer(send, 413, self._too_large(int(length)), "body_too_large")
            return
        seen, refused = 0, False

        async def bounded() -> Message:
            nonlocal seen, refused
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit and not refused:
                # NOTE: answer now; the app then reads a disconnect and its own reply is dropped
                refused = True
                await _answer(send, 413, self._too_large(seen), "body_too_large")
            return {"type": "http.disconnect"} if refused else message

        async def unless_refused(message: Message) -> None:
            if not refused:
                await send(message)

        await self.app(scope, bounded, unless_refused)

    def _too_large(self, size: int) -> str:
        return f"the request body has {size} bytes or more: at most {self.limit} allowed (--max-body-mb)"

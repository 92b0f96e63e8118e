"""Every error the server answers, in OpenAI's shape: ``{"error": {message, type, param, code}}``.

FastAPI answers an unknown path (404), a wrong method (405), a body that is not JSON or not
UTF-8 (400) and a field of the wrong type (422 in FastAPI, 400 here, as OpenAI and vLLM answer)
with its own ``{"detail": ...}``; OpenAI's clients then lose the message. :func:`install`
turns each into :class:`~graphrt.serve.protocol.RequestError`'s body.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from graphrt.serve.protocol import RequestError, validation_error

#: OpenAI's ``type`` and ``code`` of the HTTP statuses the server answers with.
KINDS: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None),
    401: ("authentication_error", "invalid_api_key"),
    404: ("invalid_request_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
    413: ("invalid_request_error", "request_too_large"),
    429: ("rate_limit_error", None),
}


class NotFound(RequestError):
    """A 404: an unknown model (``code`` ``model_not_found``) or path."""

    def __init__(self, message: str, param: str | None = None, code: str = "not_found") -> None:
        super().__init__(message, param, status=404)
        self.code = code

    def body(self) -> dict[str, object]:
        body = super().body()
        body["error"]["code"] = self.code  # type: ignore[index]
        return body


def error_body(status: int, message: str, param: str | None = None) -> dict[str, object]:
    """OpenAI's error object for ``status`` (5xx: ``server_error``)."""
    kind, code = KINDS.get(status, ("server_error" if status >= 500 else "invalid_request_error", None))
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def install(app: FastAPI) -> None:
    """Answer every refusal of ``app`` in OpenAI's error shape."""

    @app.exception_handler(RequestError)
    async def refused(request: Request, err: RequestError) -> JSONResponse:
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        err400 = validation_error(list(err.errors()))
        return JSONResponse(err400.body(), status_code=err400.status)

    @app.exception_handler(HTTPException)
    async def http(request: Request, err: HTTPException) -> JSONResponse:
        message = err.detail if isinstance(err.detail, str) else str(err.detail)
        if err.status_code == 404:
            message = f"{request.method} {request.url.path}: no such route ({message})"
        elif err.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}"
        elif err.status_code == 400:
            message = f"the request body could not be read as JSON (UTF-8): {message}"
        return JSONResponse(error_body(err.status_code, message), err.status_code, headers=err.headers)

"""The server's informational routes: ``/v1/models`` (and ``/{id}``), ``/tokenize``,
``/detokenize`` and ``/version`` (vLLM's shapes for the last three)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from graphrt.llm import LLM
from graphrt.serve.errors import NotFound
from graphrt.serve.fields import check_model
from graphrt.serve.protocol import Message, RequestError, Text
from graphrt.text.tokenizer import Tokenizer


class TokenizeRequest(BaseModel):
    """``POST /tokenize``: a ``prompt`` (as is) or chat ``messages`` (through the template)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = None
    prompt: Text | None = None
    messages: list[Message] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(BaseModel):
    """``POST /detokenize``: token ids back to text."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = None
    tokens: list[int] = Field(min_length=0)


def _card(name: str, max_model_len: int) -> dict[str, Any]:
    return {
        "id": name,
        "object": "model",
        "created": 0,
        "owned_by": "graphrt",
        "root": name,
        "max_model_len": max_model_len,
    }


def _tokenize(tokenizer: Tokenizer, body: TokenizeRequest) -> list[int]:
    if (body.prompt is None) == (body.messages is None):
        raise RequestError("give exactly one of prompt and messages", "prompt")
    if body.messages is None:
        return tokenizer.encode(body.prompt or "", body.add_special_tokens)
    try:
        return tokenizer.encode_chat([m.plain() for m in body.messages], body.add_generation_prompt)
    except ValueError as err:
        raise RequestError(str(err), "messages") from err


def info_routes(llm: LLM, name: str) -> APIRouter:
    """The routes about ``llm``, served under the model id ``name``."""
    router = APIRouter()
    tokenizer = llm.tokenizer
    assert tokenizer is not None, "the server checks for a tokenizer first"
    context = llm.engine.max_context_len
    vocab = llm.engine.model.vocab_size

    @router.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [_card(name, context)]}

    @router.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        if model_id != name:
            raise NotFound(
                f"The model `{model_id}` does not exist: this server serves `{name}`",
                "model",
                "model_not_found",
            )
        return _card(name, context)

    @router.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        check_model(body.model, name)
        ids = await asyncio.to_thread(_tokenize, tokenizer, body)  # NOTE: off the event loop
        return {"count": len(ids), "max_model_len": context, "tokens": ids}

    @router.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict[str, Any]:
        check_model(body.model, name)
        bad = next((i for i, t in enumerate(body.tokens) if not 0 <= t < vocab), None)
        if bad is not None:
            raise RequestError(f"tokens[{bad}] = {body.tokens[bad]} is out of range [0, {vocab})", "tokens")
        return {"prompt": tokenizer.decode(body.tokens, skip_special_tokens=False)}

    @router.get("/version")
    async def version() -> dict[str, str]:
        from graphrt import __version__

        return {"version": __version__}

    return router

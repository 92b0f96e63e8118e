"""Fields a request may carry that this server does not act on: refused by name, never ignored.

A field is accepted only when it is declared (:class:`~graphrt.serve.protocol.SamplingFields`
and its endpoints' models) or listed in :data:`NO_OP` with the value it carries, which changes
nothing (``tools: []``, ``logit_bias: {}``, ``best_of: 1``, ``user: "..."``). Anything else is a
400 naming the field: a known OpenAI field this server does not implement says so, an unknown
one (a typo, another server's extension) is called unknown.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from graphrt.serve.errors import NotFound
from graphrt.serve.protocol import RequestError


def _empty(value: Any) -> bool:
    return value is None or value == [] or value == {} or value == ""


def _is(*allowed: Any) -> Callable[[Any], bool]:
    return lambda value: value is None or value in allowed


def _anything(value: Any) -> bool:
    return True


#: Fields accepted although unused, and which of their values change nothing.
NO_OP: dict[str, Callable[[Any], bool]] = {
    "user": _anything,  # NOTE: an end-user id for the provider's abuse monitoring
    "metadata": _empty,
    "store": _is(False),
    "service_tier": _is("auto", "default"),
    "tools": _empty,
    "tool_choice": _is("none", "auto"),
    "parallel_tool_calls": _anything,  # NOTE: means nothing without tools, which are refused
    "functions": _empty,
    "function_call": _is("none", "auto"),
    "logit_bias": _empty,
    "best_of": _is(1),
    "suffix": _empty,
    "modalities": _is(["text"]),
    "audio": _empty,
    "prediction": _empty,
    "web_search_options": _empty,
    "reasoning_effort": _empty,
    # NOTE: extensions routers add at their neutral values (SGLang's router re-serialises every
    # request with these; vLLM's take the same names)
    "no_stop_trim": _is(False),
    "ignore_eos": _is(False),
    "skip_special_tokens": _is(True),
    "spaces_between_special_tokens": _is(True),
    "return_hidden_states": _is(False),
    "continue_final_message": _is(False),
    "separate_reasoning": _anything,  # NOTE: no-ops without a reasoning parser (none here)
    "stream_reasoning": _anything,
    "include_stop_str_in_output": _is(False),
    "min_tokens": _is(0),
    "stop_token_ids": _empty,
    "add_generation_prompt": _is(True),
    "echo": _is(False),  # NOTE: chat's (vLLM's extension); completions take echo
}

#: Keys of ``stream_options`` this server acts on.
STREAM_OPTIONS = frozenset({"include_usage"})


def check_extra(body: BaseModel) -> None:
    """Raise :class:`RequestError` naming the first field of ``body`` that would be ignored."""
    for name, value in (body.model_extra or {}).items():
        fits = NO_OP.get(name)
        if fits is None:
            raise RequestError(f"unknown field {name!r}: this server does not take it", name)
        if not fits(value):
            raise RequestError(
                f"{name} = {value!r} is not supported by this server (graphrt serve); leave it out", name
            )
    options = getattr(body, "stream_options", None) or {}
    for key in options:
        if key not in STREAM_OPTIONS:
            raise RequestError(
                f"stream_options.{key} is not supported (only include_usage)", "stream_options"
            )


def check_model(name: str | None, served: str) -> None:
    """A 404 when ``name`` (a request's ``model``; None: the default) is not ``served``."""
    if name is not None and name != served:
        raise NotFound(
            f"The model `{name}` does not exist: this server serves `{served}`", "model", "model_not_found"
        )

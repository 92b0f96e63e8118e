"""Chat templates: a checkpoint's Jinja template rendered as transformers renders it.

The environment is transformers' (``apply_chat_template``): jinja2's immutable sandbox (a
template from a checkpoint is untrusted code), ``trim_blocks`` and ``lstrip_blocks``, loop
controls, a ``tojson`` that does not escape HTML, ``raise_exception``, ``strftime_now``, and
``{% generation %}`` blocks (rendered as their body). Rendering needs jinja2 only, not
transformers, whose import costs more than the whole tokenizer here.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

#: A chat: ``[{"role": "user", "content": "..."}, ...]``.
Messages = Sequence[Mapping[str, Any]]


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@functools.cache
def _environment() -> Any:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """``{% generation %}…{% endgeneration %}``: marks the assistant's tokens for training
        masks in transformers; here it renders its body."""

        tags = {"generation"}  # noqa: RUF012 - jinja2's own class attribute

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return str(caller())

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@functools.lru_cache(maxsize=8)
def compile_template(source: str) -> Any:
    """``source`` compiled once (a ``jinja2.Template``)."""
    return _environment().from_string(source)


def render_chat(
    template: str, messages: Messages, special: Mapping[str, str], add_generation_prompt: bool = True
) -> str:
    """The text of ``messages`` through ``template``; ``special``: ``bos_token``, ``eos_token``, …

    Raises ``ValueError`` (naming the template's complaint) when the template rejects the chat,
    e.g. roles that do not alternate.
    """
    import jinja2

    try:
        return str(
            compile_template(template).render(
                messages=[dict(m) for m in messages], add_generation_prompt=add_generation_prompt, **special
            )
        )
    except jinja2.exceptions.TemplateError as err:
        raise ValueError(f"the chat template refused these messages: {err}") from err

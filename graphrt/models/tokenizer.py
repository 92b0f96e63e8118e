"""The tokenizer a checkpoint carries (``tokenizer.json`` in a directory, or the GGUF's own).

transformers builds both (``AutoTokenizer.from_pretrained(dir, gguf_file=...)`` for GGUF);
it is needed for text only, never to load or run a model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from graphrt.models.loader import resolve


def load_tokenizer(model: str | Path) -> Any:
    """The tokenizer of checkpoint ``model`` (a directory, a ``.gguf`` or a packaged name)."""
    path = resolve(model)
    if path is None:
        raise ValueError(f"{model!r} is a preset with random weights: it has no tokenizer")
    try:
        from transformers import AutoTokenizer
    except ImportError as err:
        raise ImportError(
            f"text in and out needs transformers ({err}); pip install 'graphrt[models]'"
        ) from err
    if path.suffix == ".gguf":
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return AutoTokenizer.from_pretrained(str(path))


def chat_prompt(tokenizer: Any, text: str) -> list[int]:
    """``text`` as one user turn of the model's chat template (plain encoding without one)."""
    if not getattr(tokenizer, "chat_template", None):
        return list(tokenizer.encode(text))
    messages = [{"role": "user", "content": text}]
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


#: GGUF metadata keys of tokens that end generation (llama.cpp's end-of-generation set).
GGUF_STOP_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")


def _ids(value: Any) -> set[int]:
    if value is None:
        return set()
    return {int(v) for v in value} if isinstance(value, list | tuple) else {int(value)}


def declared_stop_ids(model: str | Path) -> set[int]:
    """The EOS ids checkpoint ``model`` declares: ``eos_token_id`` of ``generation_config.json``
    and ``config.json`` (a directory; what transformers' ``generate`` stops at), or the GGUF's
    end-of-generation ids (:data:`GGUF_STOP_KEYS`)."""
    path = resolve(model)
    if path is None:
        return set()
    if path.suffix == ".gguf":
        from graphrt.models.gguf_file import read_gguf

        fields = read_gguf(path).fields
        return set().union(*(_ids(fields[k].contents()) for k in GGUF_STOP_KEYS if k in fields))
    found: set[int] = set()
    for name in ("generation_config.json", "config.json"):
        if (path / name).is_file():
            found |= _ids(json.loads((path / name).read_text()).get("eos_token_id"))
    return found


def stop_ids(tokenizer: Any, model: str | Path | None = None) -> set[int]:
    """Token ids that end a reply: the tokenizer's EOS and those ``model`` declares.

    NOTE: both, because they disagree across transformers versions: on 5.17 a SmolLM2 GGUF's
    tokenizer reported an EOS other than the file's ``<|im_end|>``, so replies ran on past it.
    """
    return _ids(tokenizer.eos_token_id) | (declared_stop_ids(model) if model is not None else set())


def reply_tokens(out: list[int], stop: set[int]) -> list[int]:
    """``out`` up to (without) its first token in ``stop``: the reply a user reads."""
    return out[: next((i for i, t in enumerate(out) if t in stop), len(out))]

"""The tokenizer a checkpoint carries (``tokenizer.json`` in a directory, or the GGUF's own).

transformers builds both (``AutoTokenizer.from_pretrained(dir, gguf_file=...)`` for GGUF);
it is needed for text only, never to load or run a model.
"""

from __future__ import annotations

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


def stop_ids(tokenizer: Any) -> set[int]:
    """Token ids that end a reply (the tokenizer's EOS)."""
    eos = tokenizer.eos_token_id
    return set(eos) if isinstance(eos, list) else ({eos} if eos is not None else set())

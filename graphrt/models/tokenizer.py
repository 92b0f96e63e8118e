"""The tokenizer a checkpoint carries (``tokenizer.json`` in a directory, or the GGUF's own).

transformers builds both (``AutoTokenizer.from_pretrained(dir, gguf_file=...)`` for GGUF);
it is needed for text only, never to load or run a model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from graphrt.models.errors import CheckpointError
from graphrt.models.gguf_file import read_gguf
from graphrt.models.gguf_header import check_gguf
from graphrt.models.loader import resolve
from graphrt.models.safetensors_dir import read_config, read_json


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
    # NOTE: transformers reads the same header or config.json, trusting it as gguf's reader does
    # (0 attention heads: ZeroDivisionError): check it first, so the message names the fault.
    if path.suffix == ".gguf":
        check_gguf(path)
    elif (path / "config.json").is_file():
        read_config(path)
    try:
        if path.suffix == ".gguf":
            return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        return AutoTokenizer.from_pretrained(str(path))
    except ImportError:
        raise
    except Exception as err:  # NOTE: transformers and tokenizers raise many kinds for a bad file
        raise CheckpointError(f"{path}: cannot build the tokenizer: {type(err).__name__}: {err}") from None


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
        fields = read_gguf(path).fields
        try:
            return set().union(*(_ids(fields[k].contents()) for k in GGUF_STOP_KEYS if k in fields))
        except (TypeError, ValueError) as err:
            raise CheckpointError(f"{path}: end-of-generation token ids are not ints: {err}") from None
    found: set[int] = set()
    for name in ("generation_config.json", "config.json"):
        if (path / name).is_file():
            raw = read_json(path / name)
            try:
                found |= _ids(raw.get("eos_token_id") if isinstance(raw, dict) else None)
            except (TypeError, ValueError) as err:
                raise CheckpointError(
                    f"{path / name}: eos_token_id is not an int or a list of ints: {err}"
                ) from None
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

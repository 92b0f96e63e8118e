"""The tokenizer a checkpoint carries: text ↔ token ids, its chat template, the ids ending a reply.

Built once, the fast way that fits the checkpoint:

| checkpoint | built from | transformers imported |
| --- | --- | --- |
| ``.gguf``, byte-level BPE (SmolLM2, Llama 3, Qwen) | the file's metadata (:mod:`.gguf_vocab`) | no |
| directory with ``tokenizer.json`` | ``tokenizers.Tokenizer.from_file`` + ``tokenizer_config.json`` | no |
| anything else with tokenizer files (sentencepiece, tiktoken) | ``AutoTokenizer`` | yes |

A ``.gguf``'s tokenizer (however built) is kept in the conversion cache
(:mod:`graphrt.text.tokenizer_cache`): a later start reads it without parsing the file.
A preset (random weights) or a directory without tokenizer files raises :class:`NoTokenizer`:
such a model takes token ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graphrt.checkpoints.errors import CheckpointError, read_json
from graphrt.checkpoints.gguf_file import read_gguf
from graphrt.checkpoints.loader import resolve
from graphrt.text import tokenizer_cache
from graphrt.text.gguf_vocab import gguf_tokenizer
from graphrt.text.template import Messages, render_chat

#: Files from which transformers can build a tokenizer that ``tokenizer.json`` is missing from.
OTHER_TOKENIZER_FILES = ("tokenizer.model", "spiece.model", "vocab.json", "tokenizer.tiktoken", "vocab.txt")
#: GGUF metadata keys of tokens that end generation (llama.cpp's end-of-generation set).
GGUF_STOP_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")


class NoTokenizer(ValueError):
    """The model has no tokenizer (a preset, or a checkpoint without tokenizer files)."""


@dataclass(slots=True)
class Tokenizer:
    """Text ↔ token ids through a ``tokenizers.Tokenizer`` (``backend``), and the chat template.

    ``special``: the special tokens' text by template name (``bos_token``, ``eos_token``, …);
    ``stop_ids``: the tokens that end a reply (EOS and what the checkpoint declares);
    ``source``: how it was built (``gguf``, ``tokenizer.json`` or ``transformers``).
    """

    backend: Any
    chat_template: str | None = None
    special: dict[str, str] = field(default_factory=dict)
    stop_ids: frozenset[int] = frozenset()
    source: str = ""

    @property
    def eos_token_id(self) -> int | None:
        eos = self.special.get("eos_token")
        return None if eos is None else self.backend.token_to_id(eos)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """``text``'s token ids (with the BOS the tokenizer adds, when ``add_special_tokens``)."""
        return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def special_in(self, text: str) -> str | None:
        """The first special token (``<|im_start|>``, the EOS, ...) written in ``text``, or None."""
        specials = {t.content for t in self.backend.get_added_tokens_decoder().values() if t.special}
        specials |= {v for v in self.special.values() if v}
        return next((s for s in sorted(specials) if s in text), None)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def render_chat(self, messages: Messages, add_generation_prompt: bool = True) -> str:
        """``messages`` as the chat template writes them (``ValueError`` without a template)."""
        if not self.chat_template:
            raise ValueError("this model's tokenizer has no chat template: give the prompt as text")
        return render_chat(self.chat_template, messages, self.special, add_generation_prompt)

    def encode_chat(self, messages: Messages, add_generation_prompt: bool = True) -> list[int]:
        """Token ids of ``messages`` through the chat template (which writes any BOS itself)."""
        return self.encode(self.render_chat(messages, add_generation_prompt), add_special_tokens=False)


def load_tokenizer(model: str | Path) -> Tokenizer:
    """The tokenizer of checkpoint ``model`` (a directory, a ``.gguf`` or a packaged name).

    Raises :class:`NoTokenizer` for a preset or a directory without tokenizer files,
    ``ImportError`` naming the install command when the checkpoint needs a package not here,
    and :class:`~graphrt.models.CheckpointError` naming the file when its tokenizer files are
    damaged (a ``tokenizer.json`` cut short, a GGUF vocabulary of the wrong types, …).
    """
    path = resolve(model)
    if path is None:
        raise NoTokenizer(f"{model!r} is a preset with random weights: it has no tokenizer; give token ids")
    if path.suffix == ".gguf" and (hit := tokenizer_cache.load(path)) is not None:
        return Tokenizer(hit.backend, hit.chat_template, hit.special, hit.stop_ids, hit.source)
    try:
        built = _from_gguf(path) if path.suffix == ".gguf" else _from_json(path)
        if built is None:
            built = _from_transformers(path)
        built.stop_ids = frozenset(stop_ids(built, path))
    except (NoTokenizer, ImportError, CheckpointError):
        raise
    except Exception as err:  # NOTE: tokenizers, jinja2 and transformers raise many kinds for a bad file
        raise CheckpointError(f"{path}: cannot build the tokenizer: {type(err).__name__}: {err}") from None
    if path.suffix == ".gguf":  # NOTE: a directory's tokenizer.json loads fast as it is
        tokenizer_cache.save(path, built, declared_stop_ids(path))
    return built


def _from_gguf(path: Path) -> Tokenizer | None:
    found = gguf_tokenizer(read_gguf(path).fields)
    return (
        None if found is None else Tokenizer(found.backend, found.chat_template, found.special, source="gguf")
    )


def _token_text(value: Any) -> str | None:
    """A special token in ``tokenizer_config.json``: a string or ``{"content": ...}``."""
    return value.get("content") if isinstance(value, dict) else value if isinstance(value, str) else None


def _from_json(path: Path) -> Tokenizer | None:
    """A directory's ``tokenizer.json`` with its config and chat template; None without it."""
    if not (path / "tokenizer.json").is_file():
        if not any((path / name).is_file() for name in OTHER_TOKENIZER_FILES):
            raise NoTokenizer(
                f"{path} has no tokenizer (tokenizer.json or one of {', '.join(OTHER_TOKENIZER_FILES)}): "
                "give token ids, or add the tokenizer files of the model"
            )
        return None
    from tokenizers import Tokenizer as Backend

    config_file = path / "tokenizer_config.json"
    config = read_json(config_file) if config_file.is_file() else {}
    if not isinstance(config, dict):
        raise CheckpointError(
            f"{config_file}: a tokenizer config is a JSON object, got {type(config).__name__}"
        )
    template = config.get("chat_template")
    if isinstance(template, list):  # NOTE: named templates; "default" is the chat one
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    if (path / "chat_template.jinja").is_file():
        template = (path / "chat_template.jinja").read_text()
    names = ("bos_token", "eos_token", "unk_token", "pad_token")
    special = {n: text for n in names if (text := _token_text(config.get(n))) is not None}
    return Tokenizer(
        Backend.from_file(str(path / "tokenizer.json")), template, special, source="tokenizer.json"
    )


def _from_transformers(path: Path) -> Tokenizer:
    try:
        from transformers import AutoTokenizer
    except ImportError as err:
        raise ImportError(
            f"the tokenizer of {path.name} needs transformers: pip install 'graphrt[models]'"
        ) from err
    try:
        if path.suffix == ".gguf":
            tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        else:
            tok = AutoTokenizer.from_pretrained(str(path))
    except (ImportError, ValueError, OSError) as err:
        raise NoTokenizer(f"transformers cannot build the tokenizer of {path}: {err}") from err
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        raise NoTokenizer(f"the tokenizer of {path} has no `tokenizers` backend ({type(tok).__name__})")
    special = {k: v for k, v in tok.special_tokens_map.items() if isinstance(v, str)}
    return Tokenizer(backend, tok.chat_template, special, source="transformers")


def chat_prompt(tokenizer: Tokenizer, text: str) -> list[int]:
    """``text`` as one user turn of the model's chat template (plain encoding without one)."""
    if not tokenizer.chat_template:
        return tokenizer.encode(text)
    return tokenizer.encode_chat([{"role": "user", "content": text}])


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
        if (hit := tokenizer_cache.load(path)) is not None:
            return set(hit.declared_stop_ids)
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


def reply_tokens(out: list[int], stop: set[int] | frozenset[int]) -> list[int]:
    """``out`` up to (without) its first token in ``stop``: the reply a user reads."""
    return out[: next((i for i, t in enumerate(out) if t in stop), len(out))]

"""A GGUF's byte-level BPE tokenizer, built straight into ``tokenizers`` from the file's metadata.

A GGUF holds llama.cpp's description of its tokenizer: ``tokenizer.ggml.model`` (``gpt2``:
byte-level BPE, as SmolLM2, Llama 3, Qwen 2/3), ``.pre`` (how text is split before BPE),
``.tokens``, ``.token_type``, ``.merges``, the special ids and ``tokenizer.chat_template``.
This is what transformers' GGUF loader reads too (``integrations/gguf``), minus the detour
through ``GPT2Tokenizer`` and transformers' import: SmolLM2's took 22 s on the H100 host.
Other tokenizer models (sentencepiece ``llama``, ``t5``) and unknown pre-tokenizers return
None here and go through transformers.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: llama.cpp token types (``tokenizer.ggml.token_type``).
CONTROL, USER_DEFINED = 3, 4
#: Names chat templates use for the special tokens → their ``tokenizer.ggml.*`` id keys.
SPECIAL_KEYS = {
    "bos_token": "bos_token_id",
    "eos_token": "eos_token_id",
    "unk_token": "unknown_token_id",
    "pad_token": "padding_token_id",
}
#: transformers' split for Llama 3 style vocabularies (``integrations/gguf``: ``_LLAMA3_SPLIT``).
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
#: transformers' ``PRETOKENIZE_REGEX`` of Qwen2 (single digits).
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True, slots=True)
class GGUFTokenizer:
    """What a GGUF says about its tokenizer: the ``tokenizers`` object, its chat template and
    the special tokens' text (``bos_token`` …, for templates)."""

    backend: Any  # tokenizers.Tokenizer
    chat_template: str | None
    special: dict[str, str]


def _byte_level(split: str | None) -> Any:
    """Byte-level pre-tokenizer: GPT-2's own regex (None), or ``split`` first."""
    from tokenizers import Regex, pre_tokenizers

    if split is None:
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _digits_first() -> Any:
    """StarCoder-style (SmolLM2's ``tokenizer.json``): every digit alone, then GPT-2's split."""
    from tokenizers import pre_tokenizers

    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _byte_level(None)])


#: ``tokenizer.ggml.pre`` → the pre-tokenizer (llama.cpp's names; aliases share one entry).
PRE_TOKENIZERS: dict[str, Callable[[], Any]] = {
    **dict.fromkeys(("default", "gpt2", "gpt-2"), lambda: _byte_level(None)),
    **dict.fromkeys(("smollm", "starcoder", "refact", "codeshell"), _digits_first),
    **dict.fromkeys(
        ("llama-bpe", "llama3", "llama-v3", "smaug-bpe", "dbrx", "falcon3"), lambda: _byte_level(LLAMA3_SPLIT)
    ),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen"), lambda: _byte_level(QWEN2_SPLIT)),
}


@functools.cache
def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte → printable character map (``bytes_to_unicode``)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars, extra = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


def _field(fields: Any, key: str) -> Any:
    field = fields.get(key)
    return None if field is None else field.contents()


def gguf_tokenizer(fields: Any) -> GGUFTokenizer | None:
    """The tokenizer a GGUF's metadata ``fields`` (``GGUFReader.fields``) describes, or None
    when it is not byte-level BPE with a known pre-tokenizer."""
    pre = _field(fields, "tokenizer.ggml.pre") or "default"
    if _field(fields, "tokenizer.ggml.model") != "gpt2" or pre not in PRE_TOKENIZERS:
        return None
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors

    spelling = _byte_alphabet()
    alphabet = set(spelling.values())
    raw = _field(fields, "tokenizer.ggml.tokens")
    spelled = [set(t) <= alphabet for t in raw]
    tokens = [
        t if ok else "".join(spelling[b] for b in t.encode("utf-8"))
        for t, ok in zip(raw, spelled, strict=True)
    ]
    merges = [tuple(m.split(" ", 1)) for m in _field(fields, "tokenizer.ggml.merges") or ()]
    backend = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges, fuse_unk=False))
    backend.pre_tokenizer = PRE_TOKENIZERS[pre]()
    backend.decoder = decoders.ByteLevel()
    types = _field(fields, "tokenizer.ggml.token_type") or [1] * len(tokens)
    # NOTE: a control token spelled outside the byte alphabet is a llama.cpp mislabel
    # (transformers skips it too): added, it would grow the vocabulary past the model's.
    backend.add_special_tokens(
        [
            AddedToken(t, normalized=False, special=True)
            for t, k, ok in zip(tokens, types, spelled, strict=True)
            if k == CONTROL and ok
        ]
    )
    backend.add_tokens(
        [
            AddedToken(t, normalized=False, special=False)
            for t, k in zip(tokens, types, strict=True)
            if k == USER_DEFINED
        ]
    )
    special = {
        name: tokens[i]
        for name, key in SPECIAL_KEYS.items()
        if (i := _field(fields, f"tokenizer.ggml.{key}")) is not None
    }
    if _field(fields, "tokenizer.ggml.add_bos_token") and "bos_token" in special:
        bos = special["bos_token"]
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tokens.index(bos))]
        )
    return GGUFTokenizer(backend, _field(fields, "tokenizer.chat_template"), special)

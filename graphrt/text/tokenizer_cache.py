"""A GGUF's tokenizer, converted once: ``tokenizer.json`` in the file's cache entry.

Building SmolLM2's tokenizer means parsing the GGUF's 49k-token vocabulary and merges
(``GGUFReader`` fields: most of a second, more on a busy host) and building the BPE model; the
cache holds the result as ``tokenizers`` JSON with the chat template, the special tokens' text
and the stop ids, so a later start reads one JSON file and never opens the GGUF. The entry is
:func:`graphrt.checkpoints.cache_dir.entry_dir` (keyed by the file's identity; ``GRAPHRT_CACHE=0``
turns it off); an entry that does not parse, records another source or holds a stop id outside
the vocabulary is ignored (one warning naming the file) and written anew.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphrt.checkpoints.cache_dir import FORMAT, entry_dir, source_id, write_atomic

log = logging.getLogger("graphrt.cache")
FILE = "tokenizer.json"


@dataclass(frozen=True, slots=True)
class CachedTokenizer:
    """What :func:`load` gives back: the ``tokenizers`` object and what came with it."""

    backend: Any  # tokenizers.Tokenizer
    chat_template: str | None
    special: dict[str, str]
    source: str
    stop_ids: frozenset[int]
    declared_stop_ids: frozenset[int]


def _file(gguf: Path) -> Path | None:
    entry = entry_dir(gguf)
    return None if entry is None else entry / FILE


def load(gguf: Path) -> CachedTokenizer | None:
    """The cached tokenizer of ``gguf``, or None (no entry, cache off, or a damaged entry)."""
    file = _file(gguf)
    if file is None or not file.is_file():
        return None
    from tokenizers import Tokenizer

    try:
        record = json.loads(file.read_text(encoding="utf-8"))
        if record.get("format") != FORMAT:
            raise ValueError(f"format {record.get('format')}")
        if record.get("source_id") != source_id(gguf):
            whose = "another file" if "source_id" in record else "a file it does not record (an older entry)"
            raise ValueError(f"built from {whose}, not from {str(gguf)!r} as it is now")
        hit = CachedTokenizer(
            Tokenizer.from_str(record["backend"]),
            record["chat_template"],
            {str(k): str(v) for k, v in record["special"].items()},
            str(record["source"]),
            frozenset(int(i) for i in record["stop_ids"]),
            frozenset(int(i) for i in record["declared_stop_ids"]),
        )
        vocab = hit.backend.get_vocab_size(with_added_tokens=True)
        bad = sorted(i for i in hit.stop_ids | hit.declared_stop_ids if not 0 <= i < vocab)
        if bad:
            raise ValueError(f"stop id {bad[0]} out of range [0, {vocab})")
        return hit
    except Exception as err:  # NOTE: tokenizers raises plain Exception on a JSON it cannot build
        log.warning("graphrt cache: ignoring %s (%s); converting again", file, err)
        file.unlink(missing_ok=True)  # NOTE: said once: the next look finds no entry until rebuilt
        return None


def save(gguf: Path, tok: Any, declared_stop_ids: set[int]) -> None:
    """Write ``tok`` (a :class:`~graphrt.text.tokenizer.Tokenizer`) to ``gguf``'s entry."""
    file = _file(gguf)
    if file is None:
        return
    record = {
        "format": FORMAT,
        "source_id": source_id(gguf),
        "source": tok.source,
        "chat_template": tok.chat_template,
        "special": tok.special,
        "stop_ids": sorted(tok.stop_ids),
        "declared_stop_ids": sorted(declared_stop_ids),
        "backend": tok.backend.to_str(),
    }
    write_atomic(file, lambda tmp: tmp.write_text(json.dumps(record, ensure_ascii=False), encoding="utf-8"))

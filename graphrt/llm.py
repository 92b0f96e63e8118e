"""``graphrt.LLM``: text in, text out, on an :class:`~graphrt.Engine` (which stays the id-level API).

A prompt is a string (encoded as is), a list of token ids, or for :meth:`LLM.chat` a list of
messages through the model's chat template. Every prompt of one call runs in the same engine
steps (continuous batching). A reply ends at the model's EOS (and any stop id its checkpoint
declares), at a stop string, or at its budget; the seed of a sampled request is random
unless ``SamplingParams(seed=...)`` gives one.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from graphrt.defaults import engine_defaults
from graphrt.engine import Engine
from graphrt.replies import Completion, Replies
from graphrt.step.ints import is_int
from graphrt.step.sampling import SamplingParams
from graphrt.text.template import Messages
from graphrt.text.tokenizer import NoTokenizer, Tokenizer, declared_stop_ids, load_tokenizer

#: A prompt: text, or token ids.
Prompt = str | Sequence[int]


def _is_ids(prompt: object) -> bool:
    return isinstance(prompt, Sequence) and not isinstance(prompt, str) and all(is_int(t) for t in prompt)


def _is_chat(messages: object) -> bool:
    return isinstance(messages, Sequence) and all(isinstance(m, Mapping) for m in messages)


def sampling_of(sampling: SamplingParams | None, keywords: Mapping[str, Any]) -> SamplingParams | None:
    """``sampling``, or (keywords given) ``SamplingParams(**keywords)``; both is a ``TypeError``."""
    if not keywords:
        return sampling
    if sampling is not None:
        raise TypeError(f"give sampling= or sampling keywords ({', '.join(keywords)}), not both")
    known = SamplingParams.__dataclass_fields__
    unknown = sorted(set(keywords) - set(known))
    if unknown:
        raise TypeError(f"unknown sampling keyword {unknown[0]!r}; known: {', '.join(known)}")
    return SamplingParams(**keywords)


class LLM:
    """A model with its tokenizer on an :class:`~graphrt.Engine`.

    Parameters
    ----------
    model : str or Path
        ``"smollm2"`` (the packaged GGUF), a ``.gguf`` file, a checkpoint directory, or a
        preset (random weights, no tokenizer: token ids in, ``text=None`` out).
    tokenizer : bool, optional
        ``True``: the model's tokenizer is required (``NoTokenizer`` or ``ImportError`` when it
        cannot be built); ``None`` (default): used when it can be built, else token ids only;
        ``False``: not built (token ids only).
    **engine_options
        Passed to :class:`~graphrt.Engine` (``device``, ``max_batch_size``,
        ``max_context_len``, ``dtype``, ``show_progress``, ``capture``, ...); unless given,
        graphs are captured lazily (:data:`CAPTURE`: each on the first step that needs it).

    Attributes
    ----------
    timings : dict of str to float
        Seconds spent building the tokenizer, loading the model and capturing its graphs.

    One call runs at a time (a lock; a stream holds it until it ends or is closed): every
    prompt of a call shares the engine's steps. ``graphrt serve`` serves concurrent callers.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] = "smollm2",
        *,
        tokenizer: bool | None = None,
        **engine_options: Any,
    ) -> None:
        if engine_options.get("tp", 1) != 1:
            raise ValueError(
                "LLM runs on one rank: use Engine(tp=N).generate on every rank for tensor parallelism"
                " (or LLM.tp_driver on rank 0 while the others follow it, as graphrt serve --tp does)"
            )
        self._build(model, tokenizer, engine_options)

    @classmethod
    def tp_driver(
        cls, model: str | os.PathLike[str], tp: int, *, tokenizer: bool | None = None, **engine_options: Any
    ) -> LLM:
        """Rank 0 of a TP group of ``tp`` ranks (``graphrt serve --tp``): every other rank builds
        ``Engine(model, tp=tp, **engine_options)`` at the same time, then runs
        :func:`graphrt.engine.tp.tp_follow` until rank 0 calls :func:`~graphrt.engine.tp.tp_end`.
        Raises ``ValueError`` on any other rank."""
        llm = cls.__new__(cls)
        llm._build(model, tokenizer, engine_options | {"tp": tp})
        if not llm.engine.tp.is_driver:
            raise ValueError(f"LLM.tp_driver runs on rank 0; this is rank {llm.engine.tp.rank}")
        return llm

    def _build(
        self, model: str | os.PathLike[str], tokenizer: bool | None, engine_options: dict[str, Any]
    ) -> None:
        start = time.perf_counter()
        #: The model as named (what the server reports as its model id).
        self.name = str(model)
        self.tokenizer: Tokenizer | None = None
        #: Why there is no tokenizer (said when text is given).
        self.no_text = "this model has no tokenizer: give token ids, not text"
        if tokenizer is not False:
            try:
                self.tokenizer = load_tokenizer(model)
            except (NoTokenizer, ImportError) as err:  # NOTE: presets, no tokenizer files, no package
                if tokenizer:
                    raise
                self.no_text = f"{err}"
        stop = self.tokenizer.stop_ids if self.tokenizer is not None else frozenset(declared_stop_ids(model))
        loaded = time.perf_counter()
        self.engine = Engine(model, **(engine_defaults(engine_options) | engine_options))
        capture = self.engine.capture_report.seconds if self.engine.capture_report else 0.0
        built = time.perf_counter() - loaded
        self.timings = {"tokenizer": loaded - start, "load": built - capture, "capture": capture}
        self.replies = Replies(self.engine, self.tokenizer, stop)
        self._lock = self.engine.lock  # NOTE: one lock: LLM calls and engine.generate take turns

    # ---- prompts ------------------------------------------------------------------------------
    def encode(self, prompt: Prompt) -> list[int]:
        """``prompt``'s token ids: text through the tokenizer (as is), ids as given."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise NoTokenizer(self.no_text)
            return self.tokenizer.encode(prompt)
        if not _is_ids(prompt):
            raise TypeError(f"a prompt is a str or a list of int token ids, got {type(prompt).__name__}")
        return list(prompt)

    def encode_chat(self, messages: Messages) -> list[int]:
        """Token ids of ``messages`` through the model's chat template."""
        if self.tokenizer is None:
            raise NoTokenizer(self.no_text)
        return self.tokenizer.encode_chat(messages)

    def _budget(self, prompt: list[int], max_new_tokens: int | None) -> int:
        """``max_new_tokens``, or (None) what the context leaves after the prompt."""
        return self.engine.max_context_len - len(prompt) if max_new_tokens is None else max_new_tokens

    # ---- generation ---------------------------------------------------------------------------
    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling: SamplingParams | None = None,
        *,
        max_new_tokens: int | None = None,
        stop: str | Sequence[str] = (),
        **keywords: Any,
    ) -> list[Completion]:
        """One :class:`Completion` per prompt (a str, a token-id list, or a list of those).

        ``sampling``: None is greedy; or give its fields as keywords (``temperature=0.7,
        top_p=0.9, seed=1, logprobs=5``). ``response_format``: OpenAI's ``{"type":
        "json_object"}`` or ``{"type": "json_schema", "json_schema": {"schema": ...}}``
        (xgrammar). ``max_new_tokens``: None runs to the end of the context. ``stop``: strings
        that end a reply (the text is cut before them; a bare ``str`` is one stop string; at
        most :data:`~graphrt.text.stream.MAX_STOPS`). Raises ``ValueError`` (naming the prompt)
        before anything runs when a prompt cannot be served.
        """
        fmt = keywords.pop("response_format", None)
        sampling = sampling_of(sampling, keywords)
        many = not isinstance(prompts, str) and not (prompts and _is_ids(prompts))  # NOTE: [] is no prompts
        ids = [self.encode(p) for p in (prompts if many else [prompts])]  # type: ignore[union-attr]
        return self._run(ids, sampling, max_new_tokens, stop, fmt)

    def chat(
        self,
        messages: Messages | Sequence[Messages],
        sampling: SamplingParams | None = None,
        *,
        max_new_tokens: int | None = None,
        stop: str | Sequence[str] = (),
        **keywords: Any,
    ) -> list[Completion]:
        """The assistant's reply to each conversation (one list of messages, or a list of them);
        sampling as in :meth:`generate`."""
        fmt = keywords.pop("response_format", None)
        sampling = sampling_of(sampling, keywords)
        chats = [messages] if messages and _is_chat(messages) else list(messages)  # type: ignore[list-item]
        return self._run([self.encode_chat(c) for c in chats], sampling, max_new_tokens, stop, fmt)  # type: ignore[arg-type]

    def stream(
        self,
        prompt: Prompt | Messages,
        sampling: SamplingParams | None = None,
        *,
        max_new_tokens: int | None = None,
        stop: str | Sequence[str] = (),
        **keywords: Any,
    ) -> Iterator[str]:
        """The reply's text as it decodes (a list of messages goes through the chat template);
        sampling as in :meth:`generate`.

        Closing the iterator early aborts the request.
        """
        make = self._constraint(keywords.pop("response_format", None))
        sampling = sampling_of(sampling, keywords)
        if self.tokenizer is None:
            raise NoTokenizer(self.no_text)
        ids = self.encode_chat(prompt) if _is_chat(prompt) and prompt else self.encode(prompt)  # type: ignore[arg-type]
        with self._lock:
            grammar = make() if make is not None else None
            rid = self.replies.add(ids, self._budget(ids, max_new_tokens), sampling, stop, grammar)
            try:
                while True:
                    for update in self.replies.step():
                        if update.rid == rid and update.text:
                            yield update.text
                        if update.rid == rid and update.done is not None:
                            return
            finally:
                self.replies.abort(rid)  # NOTE: a no-op once the reply has ended

    def _run(
        self,
        prompts: list[list[int]],
        sampling: SamplingParams | None,
        max_new_tokens: int | None,
        stop: Sequence[str],
        response_format: Mapping[str, Any] | None = None,
    ) -> list[Completion]:
        make = self._constraint(response_format)
        with self._lock:
            return self._run_locked(prompts, sampling, max_new_tokens, stop, make)

    def _constraint(self, response_format: Mapping[str, Any] | None) -> Any:
        """What makes each reply's grammar state for ``response_format`` (None: no constraint);
        ``GrammarError`` (a ``ValueError``) for a format that does not compile."""
        if response_format is None or response_format.get("type") == "text":
            return None
        from graphrt.text.grammar import Grammars

        if self.tokenizer is None:
            raise NoTokenizer(self.no_text)
        if getattr(self, "_grammars", None) is None:
            self._grammars = Grammars(self.tokenizer, self.engine.model.vocab_size)
        compiled = self._grammars.compile(response_format)
        return lambda: self._grammars.constraint(compiled)

    def _run_locked(
        self,
        prompts: list[list[int]],
        sampling: SamplingParams | None,
        max_new_tokens: int | None,
        stop: Sequence[str],
        make: Any = None,
    ) -> list[Completion]:
        rids: list[int] = []
        try:
            for i, p in enumerate(prompts):
                try:
                    grammar = make() if make is not None else None
                    rids.append(self.replies.add(p, self._budget(p, max_new_tokens), sampling, stop, grammar))
                except ValueError as err:
                    raise ValueError(f"prompt {i}: {err}") from err
            done: dict[int, Completion] = {}
            while len(done) < len(rids):
                done |= {u.rid: u.done for u in self.replies.step() if u.done is not None}
            return [done[r] for r in rids]
        finally:
            for r in rids:
                self.replies.abort(r)  # NOTE: only those still running after an error


__all__ = ["LLM", "Completion", "Prompt"]

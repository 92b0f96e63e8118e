"""A small continuous-batching engine over GraphRuntime: EXTEND eagerly, DECODE from graphs."""

from __future__ import annotations

import itertools
import os
import threading
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from graphrt.engine.batches import DecodeRows
from graphrt.engine.draft import build_draft
from graphrt.engine.overlap import Overlap, unsupported
from graphrt.engine.pool import Pool
from graphrt.engine.request import EngineStats, Request, check_prompt, engine_stats
from graphrt.engine.sampling import admit_params
from graphrt.engine.speculative import SpecOptions, SpecRunner
from graphrt.engine.stack import build_stack
from graphrt.engine.steps import EngineSteps
from graphrt.engine.tp import tp_generate
from graphrt.parallel import StepChannel, init_tp
from graphrt.runtime import CaptureReport, TPRuntime
from graphrt.step.config import RuntimeConfig
from graphrt.step.ints import int_list, is_int
from graphrt.step.modes import ForwardMode
from graphrt.step.sampling import SamplingParams, per_request


class Engine(EngineSteps):
    """Generation with a built-in model; decode steps replay captured graphs.

    Greedy by default; a request with :class:`graphrt.SamplingParams` is sampled inside the
    DECODE graph (``RuntimeConfig(sample=True)``), its first token by the same sampler on the
    eager prefill.

    Parameters
    ----------
    model : str or Path
        A preset name (``tiny-llama``; weights random from ``seed``), a checkpoint directory
        (``config.json`` + safetensors), a ``.gguf`` file, or ``"smollm2"`` (the packaged GGUF).
    device : str or torch.device, optional
        Default: CUDA when available, else CPU (emulated graphs there).
    use_graphs : bool
        Capture and replay graphs; ``False`` runs every step eagerly.
    max_batch_size, page_size, max_context_len : int
        Running requests, KV page size, longest sequence (prompt + new tokens).
    speculative : dict, optional
        Greedy speculative decoding: ``{"draft_model": "tiny-llama-draft" | checkpoint,
        "num_steps": k, "topk": 1, "num_draft_tokens": 1 + topk * k, "draft_init": "target" |
        "seed" | "checkpoint", "draft_seed": 1}``. The draft needs the target's vocabulary.
        ``topk > 1`` drafts a tree (the draft's ``topk`` best next tokens, each continued
        greedily). ``draft_init="target"`` (the default for a preset draft) gives the draft the
        target's weights by name (early exit). Each round is DRAFT_DECODE → TARGET_VERIFY →
        DRAFT_EXTEND, each a graph; tokens equal plain greedy decoding.
    kv_cache_dtype : str, optional
        DSA presets (``tiny-dsa``): ``"bf16"`` (default) or ``"fp8"`` (656 bytes per token).
    dtype : torch.dtype, optional
        Weights, activations and KV cache; default bf16 on CUDA, fp32 elsewhere.
    tp : int
        Tensor-parallel size: build on every rank of a ``torchrun --nproc-per-node tp`` world
        (or an initialised ``torch.distributed`` group of that size) and call :meth:`generate`
        on every rank; rank 0 schedules, every rank returns its tokens. Presets and checkpoints
        alike: each rank builds (or reads) only its shard. :meth:`close`, then
        ``graphrt.parallel.shutdown()``, before the process exits.
    tp_timeout_s : float, optional
        Seconds any collective waits for the other ranks before raising (naming the rank).
    overlap : bool, optional
        Run the host one step ahead of the device (:mod:`graphrt.engine.overlap`): step N+1 is
        prepared and launched while step N runs, its input ids gathered on the device from
        step N's sampled tokens, and :meth:`step` returns step N's tokens one step late. Same
        tokens as without it. Default (None): on wherever supported — CUDA, and the CPU too so
        tests run the same path — off with ``speculative`` or ``record_logits`` (``True`` with
        one of those raises ``ValueError``), and off with ``tp > 1`` unless ``True``: that
        combination has run on CPU ranks only so far.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] = "tiny-llama",
        *,
        device: str | torch.device | None = None,
        use_graphs: bool = True,
        max_batch_size: int = 32,
        page_size: int = 16,
        max_context_len: int = 2048,
        seed: int = 0,
        backend: str | None = None,
        buckets: Sequence[int] | None = None,
        record_logits: bool = False,
        show_progress: bool = False,
        speculative: dict[str, Any] | None = None,
        kv_cache_dtype: str | None = None,
        dtype: torch.dtype | None = None,
        tp: int = 1,
        tp_timeout_s: float | None = None,
        overlap: bool | None = None,
    ) -> None:
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.tp = init_tp(tp, self.device, tp_timeout_s)
        self.device = self.tp.device if tp > 1 else self.device
        self.channel = StepChannel(self.tp) if tp > 1 else None
        spec = SpecOptions.parse(speculative) if speculative is not None else None
        why_not = unsupported(spec is not None, record_logits)
        if overlap and why_not:
            raise ValueError(f"overlap=True is not supported with {why_not}: pass overlap=False or None")
        config = RuntimeConfig(
            max_batch_size=max_batch_size,
            max_context_len=max_context_len,
            page_size=page_size,
            buckets=tuple(buckets) if buckets else None,
            capture_modes=((ForwardMode.TARGET_VERIFY,) if spec else (ForwardMode.DECODE,))
            if use_graphs
            else (),
            backend=backend,
            speculative=spec.geometry if spec else None,
            sample=spec is None,  # NOTE: speculative decoding stays greedy
        )
        stack = build_stack(
            str(model), self.device, config, seed=seed, kv_cache_dtype=kv_cache_dtype, dtype=dtype, tp=self.tp
        )
        self.model, self.kv, self.runtime = stack.model, stack.kv, self._ranked(stack.runtime, 0)
        self.use_graphs, self.record_logits = use_graphs, record_logits
        self.capture_report: CaptureReport | None = (
            self.runtime.capture(show_progress) if use_graphs else None
        )
        self.spec: SpecRunner | None = None
        if spec is not None:
            self.spec = self._draft_runner(spec, config, show_progress)
        self.max_context_len, self.page_size = max_context_len, page_size
        self.overlap: Overlap | None = None
        if why_not is None and (overlap or (overlap is None and tp == 1)):
            rows = self.runtime.req_to_token.max_reqs
            self.overlap = Overlap(rows + 1, rows, self.device)
        tables = (self.runtime.req_to_token,) + ((self.spec.draft.req_to_token,) if self.spec else ())
        self.pool = Pool(max_batch_size, self.kv.dummy_page, page_size, tables)
        self._rows: DecodeRows | None = None  # NOTE: rebuilt whenever the running set changes
        self._ended = False  # the last overlapped read ended a request (see _take)
        self._ids = itertools.count()
        self._seeds = np.random.default_rng()  # NOTE: only for requests that give no seed
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        #: Requests that ended and were not taken yet (``generate`` takes its own).
        self.finished: dict[int, Request] = {}
        self._handed_out = 0  # NOTE: tokens of the finished requests generate took (stats)
        # NOTE: re-entrant: generate steps through step(), which takes it too
        self._lock = threading.RLock()
        self.logits: dict[int, list[torch.Tensor]] = {}
        self._decode_steps, self._decode_seconds, self._prefill_steps = 0, 0.0, 0

    def _draft_runner(self, spec: SpecOptions, config: RuntimeConfig, show_progress: bool) -> SpecRunner:
        """The draft model's stack (same pages and request rows as the target's) and runner."""
        draft = build_draft(
            spec,
            self.model,
            self.kv,
            config,
            self.device,
            use_graphs=self.use_graphs,
            tp=self.tp,
            show_progress=show_progress,
        )
        self.draft_model = draft.model
        self.draft_runtime = self._ranked(draft.runtime, 1)
        return SpecRunner(self.runtime, self.draft_runtime, spec, config.page_size, self.kv)

    def _ranked(self, runtime: Any, target: int) -> Any:
        """With TP, a runtime whose steps every rank runs with rank 0's batch."""
        return runtime if self.channel is None else TPRuntime(runtime, self.channel, target)

    # ---- requests ------------------------------------------------------------------------
    def add_request(
        self, prompt: Sequence[int], max_new_tokens: int, sampling: SamplingParams | None = None
    ) -> int:
        """Queue a prompt; returns its request id. Raises ``ValueError`` on bad input.

        ``sampling``: None decodes greedily; a sampled request (``temperature > 0``) on a
        speculative engine is refused (``ValueError``). Token ids and ``max_new_tokens`` are
        ints (``TypeError`` otherwise, naming the argument and the index).
        """
        with self._lock:
            req = self._request(prompt, max_new_tokens, sampling)
            self.waiting.append(req)
            return req.rid

    def _request(self, prompt: Any, max_new_tokens: Any, sampling: Any, name: str = "prompt") -> Request:
        """A checked new request (not queued)."""
        vocab = self.model.vocab_size
        tokens = check_prompt(prompt, max_new_tokens, vocab, self._lookahead, self.max_context_len, name)
        params = admit_params(sampling, speculative=self.spec is not None, vocab_size=vocab, rng=self._seeds)
        return Request(next(self._ids), tokens, int(max_new_tokens), sampling=params)

    def step(self) -> list[tuple[int, int]]:
        """One forward (see :meth:`EngineSteps.step`); one thread at a time."""
        with self._lock:
            return super().step()

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int | Sequence[int],
        sampling: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[list[int]]:
        """Completions of ``prompts`` (continuous batching; order preserved).

        Parameters
        ----------
        prompts : sequence of sequence of int
            Token ids of each prompt (lists of ints or 1-D integer arrays; a string, a float or
            a bool is a ``TypeError`` naming the prompt and the index).
        max_new_tokens : int or sequence of int
            Budget per prompt (one for all, or one each).
        sampling : SamplingParams, sequence of SamplingParams, optional
            None: greedy. One value for every prompt, or one per prompt. A request ends at its
            budget or at a stop token (included in its output).

        Returns
        -------
        list of list of int: the new tokens of each prompt.

        Safe to call from several threads: calls run one at a time, each getting the tokens
        it would get alone. Every input is checked before any request is queued; a call that
        raises (a refused step, ``KeyboardInterrupt``) leaves none of its requests behind,
        and a call that returns leaves none either (the engine forgets them).

        With TP, call it on every rank: rank 0's prompts, budgets and sampling are generated,
        every rank returns them.
        """
        with self._lock:
            if self.channel is not None:
                runtimes = {0: self.runtime} | ({1: self.draft_runtime} if self.spec is not None else {})
                if self.channel.group.is_driver:
                    self._requests(prompts, max_new_tokens, sampling)  # NOTE: refuse before sharing
                return tp_generate(self.channel, runtimes, self._generate, prompts, max_new_tokens, sampling)
            return self._generate(prompts, max_new_tokens, sampling)

    def _requests(self, prompts: Any, max_new_tokens: Any, sampling: Any) -> list[Request]:
        """Checked new requests, one per prompt (none queued)."""
        if not isinstance(prompts, (list, tuple, np.ndarray)):
            raise TypeError(
                f"prompts must be a list of prompts (lists of int token ids), got {type(prompts).__name__}"
            )
        if is_int(max_new_tokens):
            limits = [max_new_tokens] * len(prompts)
        elif isinstance(max_new_tokens, (list, tuple, np.ndarray)):
            limits = int_list("max_new_tokens", max_new_tokens)
        else:
            raise TypeError(
                f"max_new_tokens must be an int or a list of ints, got {type(max_new_tokens).__name__} "
                f"{max_new_tokens!r}"
            )
        if len(limits) != len(prompts):
            raise ValueError(f"{len(limits)} max_new_tokens for {len(prompts)} prompts")
        params = per_request(sampling, len(prompts))
        return [
            self._request(p, n, s, f"prompts[{i}]")
            for i, (p, n, s) in enumerate(zip(prompts, limits, params, strict=True))
        ]

    def _generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int | Sequence[int],
        sampling: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[list[int]]:
        reqs = self._requests(prompts, max_new_tokens, sampling)
        self.waiting.extend(reqs)
        try:
            while self.waiting or self.running:
                self.step()
        except BaseException:
            self._forget(reqs)
            raise
        outputs = [self.finished.pop(r.rid).output for r in reqs]
        self._handed_out += sum(len(o) for o in outputs)
        return outputs

    def close(self) -> None:
        """Release the captured graphs (and sync): do this before a process group is destroyed."""
        for runtime in (self.runtime, getattr(self, "draft_runtime", None)):
            if runtime is not None:
                runtime.release()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def stats(self) -> EngineStats:
        """Counters so far: replays, eager steps and fallbacks, decode rate, acceptance."""
        generated = self._handed_out + sum(len(r.output) for r in (*self.finished.values(), *self.running))
        counts = (self._decode_steps, self._decode_seconds, self._prefill_steps, generated)
        return engine_stats(self.runtime.stats(), *counts, self.spec)

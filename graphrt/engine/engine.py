"""A small continuous-batching engine over GraphRuntime: DECODE and short prefills from graphs."""

from __future__ import annotations

import itertools
import os
import threading
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from graphrt.engine.config import EngineConfig
from graphrt.engine.draft import build_draft
from graphrt.engine.lookup import LookupRunner
from graphrt.engine.overlap import Overlap, unsupported
from graphrt.engine.pool import Pool
from graphrt.engine.request import (
    GenerateCall,
    Request,
    budgets,
    check_encoder_ids,
    check_prompt,
    check_prompts,
)
from graphrt.engine.sampling import admit_params
from graphrt.engine.scheduler import Scheduler
from graphrt.engine.speculative import SpecOptions, SpecRunner
from graphrt.engine.stack import build_stack
from graphrt.engine.stats import EngineStats, engine_stats
from graphrt.engine.tp import tp_generate, tp_runtimes
from graphrt.parallel import StepChannel, init_tp
from graphrt.runtime import CaptureReport, TPRuntime
from graphrt.runtime.progress import load_progress
from graphrt.step.config import RuntimeConfig
from graphrt.step.sampling import SamplingParams, per_request


class Engine:
    """Generation with a built-in model; decode steps replay captured graphs.

    Greedy by default; a request with :class:`graphrt.SamplingParams` is sampled inside the
    DECODE graph (``RuntimeConfig(sample=True)``), its first token by the same sampler in the
    prefill (a MIXED graph's replay when it fits one, else EXTEND, eagerly).

    Parameters
    ----------
    model : str or Path
        A preset name (``tiny-llama``; weights random from ``seed``), a checkpoint directory
        (``config.json`` + safetensors), a ``.gguf`` file, or ``"smollm2"`` (the packaged GGUF).
    config : EngineConfig, optional
        How to build it (:class:`~graphrt.engine.config.EngineConfig` documents every field).
    **options
        Fields of :class:`EngineConfig` replaced for this engine (``Engine("smollm2",
        max_batch_size=8)``); an unknown name is a ``TypeError``.

    With ``tp > 1`` call :meth:`generate` on every rank (rank 0's prompts are generated),
    then :meth:`close` and ``graphrt.parallel.shutdown()`` before the process exits.
    """

    def __init__(
        self, model: str | os.PathLike[str] = "tiny-llama", config: EngineConfig | None = None, **options: Any
    ) -> None:
        self.config = cfg = EngineConfig.of(config, options)
        self.device = torch.device(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.tp = init_tp(cfg.tp, self.device, cfg.tp_timeout_s)
        self.device = self.tp.device if cfg.tp > 1 else self.device
        self.channel = StepChannel(self.tp) if cfg.tp > 1 else None
        spec = SpecOptions.parse(cfg.speculative) if cfg.speculative is not None else None
        why_not = unsupported(spec, cfg.tp, cfg.record_logits, cfg.prefill_chunk is not None)
        if cfg.overlap and why_not:
            raise ValueError(f"overlap=True is not supported with {why_not}: pass overlap=False or None")
        runtime_config = cfg.runtime_config(spec)
        with load_progress(cfg.show_progress) as advance:
            stack = build_stack(
                str(model),
                self.device,
                runtime_config,
                seed=cfg.seed,
                kv_cache_dtype=cfg.kv_cache_dtype,
                quantization=cfg.quantization,
                dtype=cfg.dtype,
                tp=self.tp,
                progress=advance,
                optional_mixed=True,
            )
        self.model, self.kv, self.runtime = stack.model, stack.kv, self._ranked(stack.runtime, 0)
        self.encoder = stack.encoder
        self.use_graphs = cfg.use_graphs
        self.max_context_len, self.page_size = cfg.max_context_len, cfg.page_size
        self.capture_report: CaptureReport | None = (
            self.runtime.capture(cfg.show_progress) if cfg.use_graphs else None
        )
        self.spec = self._speculator(spec, runtime_config, cfg.show_progress) if spec else None
        overlap = None
        if why_not is None and (cfg.overlap or (cfg.overlap is None and cfg.tp == 1)):
            assert self.runtime.tokens is not None, "the engine's runtime samples"
            overlap = Overlap(self.runtime.tokens, self.runtime.req_to_token.max_reqs, self.device)
        draft = self.spec.draft if self.spec else None
        tables = (self.runtime.req_to_token,) + ((draft.req_to_token,) if draft is not None else ())
        tables += (self.encoder,) if self.encoder is not None else ()
        caching = cfg.caches_prefixes(self.encoder, self.runtime.req_to_token.window)
        pool = Pool(cfg.max_batch_size, self.kv.dummy_page, cfg.page_size, tables, prefix_caching=caching)
        self.scheduler = Scheduler(
            self.runtime,
            pool,
            spec=self.spec,
            overlap=overlap,
            use_graphs=cfg.use_graphs,
            record_logits=cfg.record_logits,
            encode=self._encode if self.encoder is not None else None,
            chunk=cfg.prefill_chunk,
        )
        self._ids = itertools.count()
        self._seeds = np.random.default_rng()  # NOTE: only for requests that give no seed
        #: One generate() at a time: concurrent callers are served one after another, each
        #: getting exactly the tokens it would get alone. ``graphrt.LLM`` holds the same lock
        #: for its calls, so an LLM and its engine used from two threads take turns.
        self.lock = threading.Lock()
        self._generated = 0  # NOTE: counted as steps hand tokens out, whoever drives them

    # ---- the scheduler's state, as engine builders read it ---------------------------------
    @property
    def waiting(self) -> deque[Request]:
        """Requests queued and not admitted yet."""
        return self.scheduler.waiting

    @property
    def running(self) -> list[Request]:
        """Requests in the running batch."""
        return self.scheduler.running

    @property
    def finished(self) -> dict[int, Request]:
        """Finished requests by id, until their caller takes them."""
        return self.scheduler.finished

    @property
    def logits(self) -> dict[int, list[torch.Tensor]]:
        """Per request id, each step's logits row (``record_logits`` only)."""
        return self.scheduler.logits

    @property
    def pool(self) -> Pool:
        """Free request rows and pages."""
        return self.scheduler.pool

    @property
    def overlap(self) -> Overlap | None:
        """The host-ahead state, when the engine overlaps."""
        return self.scheduler.overlap

    @property
    def record_logits(self) -> bool:
        """Whether every step's logits are kept (:attr:`logits`)."""
        return self.scheduler.record_logits

    def step(self) -> list[tuple[int, int]]:
        """One forward (see :meth:`Scheduler.step`): the ``(request id, token)`` pairs produced."""
        produced = self.scheduler.step()
        self._generated += len(produced)
        return produced

    def _speculator(
        self, spec: SpecOptions, config: RuntimeConfig, show_progress: bool
    ) -> SpecRunner | LookupRunner:
        """A proposer's runner, or the draft's stack (the target's pages and rows) and runner."""
        if not spec.uses_draft_model:
            if spec.geometry.topk > 1 and self.tp.size > 1:  # NOTE: the host moves a tree's KV
                raise ValueError(f"tree drafts (topk {spec.geometry.topk}) need tp 1, got {self.tp.size}")
            return LookupRunner(self.runtime, spec, config.page_size, self.kv)
        draft = build_draft(
            spec, self.model, self.kv, config, self.device, use_graphs=self.use_graphs, tp=self.tp,
            show_progress=show_progress,
        )  # fmt: skip
        self.draft_model = draft.model
        self.draft_runtime = self._ranked(draft.runtime, 1)
        return SpecRunner(self.runtime, self.draft_runtime, spec, config.page_size, self.kv)

    def _ranked(self, runtime: Any, target: int) -> Any:
        """With TP, a runtime whose steps every rank runs with rank 0's batch."""
        return runtime if self.channel is None else TPRuntime(runtime, self.channel, target)

    def _encode(self, req: Request) -> None:
        """Write an admitted request's encoder output into its row of the encoder cache."""
        assert self.encoder is not None and req.encoder_ids is not None
        self.model.encode_into(self.encoder, req.req_idx, req.encoder_ids)

    # ---- requests ------------------------------------------------------------------------
    def add_request(
        self,
        prompt: Sequence[int],
        max_new_tokens: int,
        sampling: SamplingParams | None = None,
        encoder_ids: Sequence[int] | None = None,
        constraint: Any = None,
    ) -> int:
        """Queue a prompt; returns its request id. Raises ``ValueError`` on bad input.

        ``sampling``: None decodes greedily (speculative engines too: sampled requests get the
        tokens plain sampling would draw). ``encoder_ids``: an encoder-decoder
        model's encoder input (required there, refused elsewhere), encoded once at admission.
        ``constraint``: a grammar the output follows (:mod:`graphrt.engine.constraints`).
        """
        vocab = self.model.vocab_size
        tokens = check_prompt(prompt, max_new_tokens, vocab, self.scheduler.lookahead, self.max_context_len)
        enc = check_encoder_ids(self.model, self.encoder, encoder_ids)
        extras = self.runtime.config if self.channel is None else None  # NOTE: TP: none of them
        params = admit_params(sampling, extras, vocab, self._seeds, constraint)
        req = Request(next(self._ids), tokens, max_new_tokens, sampling=params, encoder_ids=enc)
        req.constraint = constraint
        self.waiting.append(req)
        return req.rid

    def abort(self, rid: int) -> Request | None:
        """Drop request ``rid`` wherever it is (waiting, running or finished); returns it (its
        output so far), or None when no request has that id.

        A running request gives its row (its KV freed in the ledger) and pages back at once;
        with overlap a step holding it may still be in flight, and its token is dropped when
        read. Not under :meth:`generate`'s lock: for a caller that drives :meth:`step` itself.
        """
        req = self.scheduler.find(rid)
        self.scheduler.abort({rid})
        return req

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int | Sequence[int],
        sampling: SamplingParams | Sequence[SamplingParams] | None = None,
        encoder_ids: Sequence[Sequence[int]] | None = None,
    ) -> list[list[int]]:
        """Completions of ``prompts`` (continuous batching; order preserved).

        Parameters
        ----------
        prompts : sequence of sequence of int
            Token ids of each prompt.
        max_new_tokens : int or sequence of int
            Budget per prompt (one for all, or one each).
        sampling : SamplingParams, sequence of SamplingParams, optional
            None: greedy. One value for every prompt, or one per prompt. A request ends at its
            budget or at a stop token (included in its output).
        encoder_ids : sequence of sequence of int, optional
            An encoder-decoder model's encoder input, one per prompt (required there).

        Returns
        -------
        list of list of int: the new tokens of each prompt.

        With TP, call it on every rank: rank 0's prompts, budgets and sampling are generated,
        every rank returns them.
        """
        call = GenerateCall(prompts, max_new_tokens, sampling, encoder_ids)
        with self.lock:
            if self.channel is None:
                return self._generate(call)
            if encoder_ids is not None:
                raise ValueError("encoder_ids: encoder-decoder models run on one rank (tp 1)")
            return tp_generate(self.channel, tp_runtimes(self), self._generate, call)

    def _generate(self, call: GenerateCall) -> list[list[int]]:
        """:meth:`generate` on this rank's engine: add the call's requests, step until done."""
        prompts = check_prompts(call.prompts)
        limits = budgets(call.max_new_tokens, len(prompts))
        params = per_request(call.sampling, len(prompts))
        encoded = [None] * len(prompts) if call.encoder_ids is None else list(call.encoder_ids)
        if len(encoded) != len(prompts):
            raise ValueError(f"{len(encoded)} encoder_ids for {len(prompts)} prompts")
        ids: list[int] = []
        try:
            for p, n, s, e in zip(prompts, limits, params, encoded, strict=True):
                ids.append(self.add_request(p, n, s, e))
            while self.waiting or self.running:
                self.step()
        except BaseException:
            # NOTE: bad input, a refused step or Ctrl-C: this call leaves no request behind.
            self.scheduler.abort(set(ids))
            raise
        return [self.finished.pop(i).output for i in ids]

    def close(self) -> None:
        """Release the captured graphs (and sync): do this before a process group is destroyed."""
        for runtime in (self.runtime, getattr(self, "draft_runtime", None)):
            if runtime is not None:
                runtime.release()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def stats(self) -> EngineStats:
        """Counters so far: replays, eager steps and fallbacks, decode rate, acceptance."""
        sched = self.scheduler
        return engine_stats(self.runtime.stats(), sched, self._generated, self.spec)

"""How an :class:`~graphrt.Engine` is built: one typed config instead of a bag of keywords."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from graphrt.engine.spec_options import SpecOptions
from graphrt.step.config import RuntimeConfig
from graphrt.step.modes import ForwardMode

#: ``EngineConfig.prefill_graph_tokens`` unless given: a prefill after a prefix-cache hit (tens
#: to hundreds of tokens) replays a graph; a long cold prompt, whose forward outweighs its host
#: cost, runs eagerly.
PREFILL_GRAPH_TOKENS = 256


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Everything an engine is built from besides its model.

    Parameters
    ----------
    device : str or torch.device, optional
        Default: CUDA when available, else CPU (emulated graphs there).
    use_graphs : bool
        Capture and replay graphs; ``False`` runs every step eagerly.
    max_batch_size, page_size, max_context_len : int
        Running requests, KV page size, longest sequence (prompt + new tokens).
    seed : int
        Weights of a preset (random from this seed).
    backend : str, optional
        Attention backend (``graphrt.attention.BACKENDS``); default: the preferred available one.
    buckets : sequence of int, optional
        The graphs' batch sizes; default: the runtime's ladder up to ``max_batch_size``.
    record_logits : bool
        Keep every step's logits per request (``Engine.logits``); samples on the host.
    show_progress : bool
        Progress bars on stderr while the checkpoint loads and the graphs are captured.
    capture : str
        ``"eager"``: every graph is captured while the engine is built; ``"lazy"`` (what
        ``graphrt.LLM`` and ``graphrt serve`` use): each (mode, bucket) the first time a step
        needs it, into the same memory pool, with the same tokens (``RuntimeConfig.capture``).
        With ``tp > 1`` every rank must be built with the same value.
    record_kernels : bool
        List each CUDA graph's kernels at capture (``RuntimeConfig.record_kernels``), for a
        snapshot; off by default (seconds of start-up).
    speculative : dict, optional
        Speculative decoding (``graphrt.engine.spec_options.SpecOptions``): ``{"method":
        "draft_model" | "ngram" | "suffix", "num_steps": k, "topk": 1, "num_draft_tokens":
        1 + topk * k}`` plus, for ``draft_model``, ``{"draft_model": "tiny-llama-draft" |
        checkpoint, "draft_init": "target" | "seed" | "checkpoint", "draft_seed": 1}`` (the
        draft needs the target's vocabulary; each round is DRAFT_DECODE → TARGET_VERIFY →
        DRAFT_EXTEND, each a graph) and, for ``ngram`` / ``suffix`` (no draft model: one
        TARGET_VERIFY a round, a DECODE when nothing drafts), ``{"min_match": 3, "max_match":
        8, "disable_batch_size": 0, "min_acceptance": 0.2, "backoff_rounds": 4, "min_hit_rate":
        0.6}``. ``topk > 1`` drafts a tree (``draft_model``, ``suffix``). Greedy tokens equal plain greedy decoding;
        sampled requests' tokens are the ones plain sampling draws for the same seed.
    kv_cache_dtype : str, optional
        ``"fp8_e4m3"`` for an FP8 MHA/GQA cache; DSA presets: ``"bf16"`` or ``"fp8"`` (656 bytes).
    quantization : str, optional
        ``"fp8"``: the projections' weights as e4m3 with per-row scales, quantized at load
        (:mod:`graphrt.models.quantize`); None keeps the checkpoint's dtype.
    dtype : torch.dtype, optional
        Weights, activations and (by default) KV cache; bf16 on CUDA, fp32 elsewhere.
    tp : int
        Tensor-parallel size: build on every rank of a ``torchrun --nproc-per-node tp`` world;
        rank 0 schedules, every rank returns its tokens.
    tp_timeout_s : float, optional
        Seconds any collective waits for the other ranks before raising (naming the rank).
    overlap : bool, optional
        Run the host one step ahead of the device (:mod:`graphrt.engine.overlap`). Default
        (None): on wherever supported, off with ``speculative`` or ``record_logits`` (``True``
        with one of those raises ``ValueError``) and with ``tp > 1`` unless ``True``.
    max_logprobs : int
        Top log-probabilities each sampling step computes inside its graph (one more small op
        per step); requests may then ask ``SamplingParams(logprobs=0..max_logprobs)``. 0: none
        (requests asking for them are refused). Not with ``speculative`` or ``tp > 1``.
    penalties : bool
        Keep per-request token counts on the device so that requests may set presence,
        frequency and repetition penalties (applied inside the sampling step). Off: refused.
        Not with ``speculative``, ``record_logits`` or ``tp > 1``.
    token_masks : bool
        Keep an allowed-token bitmask per request row, applied inside the sampling step, so that
        requests may follow a grammar (``add_request(constraint=...)``; JSON mode and schemas).
        Not with ``speculative``, ``record_logits`` or ``tp > 1``.
    prefix_caching : bool, optional
        Automatic prefix caching (:mod:`graphrt.engine.prefix_cache`): full prompt pages are
        kept and reused by later prompts that start the same, whose prefill computes only the
        rest. Default (None): on wherever supported, off with ``speculative``, ``tp > 1``,
        an encoder-decoder model or a window KV pool (``True`` with one of those raises
        ``ValueError`` naming it); ``False``: off.
    prefill_chunk : int, optional
        Chunked prefill (:mod:`graphrt.engine.chunked`): a step holds the decode rows and up to
        this many tokens in all, prompts prefilling in chunks, so a long prompt never stalls
        the running requests. None (default): whole prompts, each prefill a step of its own.
        Not with ``speculative``; turns ``overlap`` off (``overlap=True`` raises). With
        ``use_graphs`` such steps (and prefill-only chunks) replay MIXED graphs, captured per
        token bucket of :func:`token_ladder` ``(max(prefill_chunk, max_batch_size))``, with
        ``penalties``, ``max_logprobs`` and ``token_masks`` alike: a decode row and a prompt's
        last chunk get their penalised, masked token and its log-probabilities as on DECODE
        and whole-prompt steps (same tokens), an earlier chunk's draw is dropped.
    prefill_graph_tokens : int, optional
        Prefill graphs (:mod:`graphrt.engine.prefill`): with ``use_graphs`` a prefill-only step
        (whole prompts, each after its prefix-cache hit) of at most ``max(prefill_graph_tokens,
        max_batch_size)`` tokens replays a MIXED graph (one metadata write and one launch,
        overlapped or not) instead of running EXTEND eagerly; a larger one still runs EXTEND
        eagerly. Captured per token bucket of :func:`token_ladder`, as ``capture`` says (lazy:
        only the buckets steps use). Same tokens, penalties, masks and log-probabilities as the
        eager prefill. 0 or None: off. Ignored with ``prefill_chunk`` (its chunks replay its
        own ladder), a draft model (``speculative``'s ``draft_model``: its draft prefills on its
        own runtime), ``tp > 1`` and ``record_logits``; proposer speculation (``ngram``,
        ``suffix``) prefills in the graphs as plain decoding does. Where the model's attention
        backend graphs no MIXED (sparse MLA, encoder-decoder models) prefills run eagerly.
    """

    device: str | torch.device | None = None
    use_graphs: bool = True
    max_batch_size: int = 32
    page_size: int = 16
    max_context_len: int = 2048
    seed: int = 0
    backend: str | None = None
    buckets: Sequence[int] | None = None
    record_logits: bool = False
    show_progress: bool = False
    capture: str = "eager"
    record_kernels: bool = False
    speculative: dict[str, Any] | None = None
    kv_cache_dtype: str | None = None
    quantization: str | None = None
    dtype: torch.dtype | None = None
    tp: int = 1
    tp_timeout_s: float | None = None
    overlap: bool | None = None
    deterministic: bool = False
    max_logprobs: int = 0
    penalties: bool = False
    token_masks: bool = False
    prefix_caching: bool | None = None
    prefill_chunk: int | None = None
    prefill_graph_tokens: int | None = PREFILL_GRAPH_TOKENS

    def __post_init__(self) -> None:
        chunk = self.prefill_chunk
        if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
            raise ValueError(f"prefill_chunk must be a positive int (tokens per step) or None, got {chunk!r}")
        tokens = self.prefill_graph_tokens
        if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0):
            raise ValueError(f"prefill_graph_tokens must be an int >= 0 (0: off) or None, got {tokens!r}")
        if chunk is not None and self.speculative is not None:
            raise ValueError(
                "prefill_chunk does not combine with speculative decoding: pass prefill_chunk=None"
            )

    @classmethod
    def of(cls, config: EngineConfig | None, options: dict[str, Any]) -> EngineConfig:
        """``config`` (default: all defaults) with ``options`` replaced; an unknown option is a
        ``TypeError`` naming it and listing the known ones."""
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise TypeError(f"unknown engine option {unknown[0]!r}; options: {', '.join(known)}")
        return dataclasses.replace(config or cls(), **options)

    def caches_prefixes(self, encoder: object | None, window_pool: object | None) -> bool:
        """Whether the engine caches prefixes; ``ValueError`` naming what ``prefix_caching=True``
        does not combine with. ``encoder``: an encoder-decoder model's encoder cache (its KV
        depends on the encoder input); ``window_pool``: the runtime's window KV pool (a window
        page has one owner). None: the model has none."""
        refusals = (
            ("speculative decoding", self.speculative is not None),
            (f"tp={self.tp}", self.tp > 1),
            ("an encoder-decoder model", encoder is not None),
            ("a window KV pool", window_pool is not None),
        )
        why = next((name for name, on in refusals if on), None)
        if self.prefix_caching and why:
            raise ValueError(f"prefix_caching=True does not combine with {why}: pass prefix_caching=False")
        return why is None and self.prefix_caching is not False

    def runtime_config(self, spec: SpecOptions | None) -> RuntimeConfig:
        """The runtime's config: DECODE graphs; with speculation (``spec``) TARGET_VERIFY's too,
        or only those with a draft model (its rounds never decode)."""
        decode = spec is None or not spec.uses_draft_model
        modes = (ForwardMode.TARGET_VERIFY,) * (spec is not None) + (ForwardMode.DECODE,) * decode
        tokens = self.token_buckets(spec)
        mixed = bool(tokens)
        modes = (modes + (ForwardMode.MIXED,) * mixed) if self.use_graphs else ()
        return RuntimeConfig(
            max_batch_size=self.max_batch_size,
            max_context_len=self.max_context_len,
            page_size=self.page_size,
            buckets=tuple(self.buckets) if self.buckets else None,
            capture_modes=modes,
            capture=self.capture,
            backend=self.backend,
            speculative=spec.geometry if spec else None,
            sample=True,  # NOTE: a verify draws every node's token in its graph, too
            logprobs=self.max_logprobs if spec is None and self.tp == 1 else 0,
            penalties=self.penalties and spec is None and self.tp == 1 and not self.record_logits,
            token_masks=self.token_masks and spec is None and self.tp == 1 and not self.record_logits,
            record_kernels=self.record_kernels,
            deterministic=self.deterministic,
            token_buckets=tokens if self.use_graphs else (),
        )

    def token_buckets(self, spec: SpecOptions | None) -> tuple[int, ...]:
        """The MIXED token buckets: chunked prefill's ladder (up to ``max(prefill_chunk,
        max_batch_size)``: its steps hold at most that many tokens), else the prefill graphs'
        (``prefill_graph_tokens``, not with a draft model, ``tp > 1`` or ``record_logits``:
        such a step returns every row's logits, ``[T, V]`` float32 a graph); () when neither.

        NOTE: a proposer engine (``ngram`` / ``suffix``) prefills on the target's runtime alone,
        sampled like a plain engine's prefill: an eager one there costs a short prompt's
        whole forward in host launches, which its first rounds wait for."""
        if self.prefill_chunk is not None:
            return token_ladder(max(self.prefill_chunk, self.max_batch_size))
        drafted = spec is not None and spec.uses_draft_model
        if not self.prefill_graph_tokens or drafted or self.tp > 1 or self.record_logits:
            return ()
        return token_ladder(max(self.prefill_graph_tokens, self.max_batch_size))


def token_ladder(largest: int) -> tuple[int, ...]:
    """MIXED token buckets up to ``largest``: the powers of two below it, then ``largest``
    (a chunked step fills its budget but for a prompt's last chunk)."""
    return (*(1 << i for i in range(largest.bit_length()) if 1 << i < largest), largest)

"""Runtime configuration: capacities and switches, validated once."""

from __future__ import annotations

from dataclasses import dataclass

from graphrt.step.modes import MODES, ForwardMode, SpecGeometry, rows_per_req

#: When graphs are captured: all at once (``eager``) or each on the first step that needs it.
CAPTURE_POLICIES = ("eager", "lazy")


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeConfig:
    """What the runtime preallocates and captures.

    Parameters
    ----------
    max_batch_size : int
        Largest captured bucket (always captured). Batches up to ``max_reqs`` still run,
        eagerly, with a counted fallback.
    max_context_len : int
        Longest sequence (KV length) a request may reach.
    page_size : int
        KV page size in tokens (>= 1).
    buckets : tuple of int, optional
        Batch sizes to capture; default ladder 1, 2, 4, 8, 12, 16, 24, … capped at max.
    capture_modes : tuple of ForwardMode
        Modes to record graphs for.
    backend : str, optional
        ``"fa3"`` or ``"reference"``; default: the best one available on the device.
    engine : str, optional
        ``"cuda"`` or ``"emulated"``; default: cuda on a CUDA device, emulated otherwise.
    capture : str
        ``"eager"``: :meth:`GraphRuntime.capture` records every (mode, bucket) at once;
        ``"lazy"``: it records none, and each graph is captured the first time a step needs it
        (that step then replays it; the same graph, the same tokens).
    warmup : int
        Eager runs of each graph's step before it is captured.
    debug : bool
        Poison every static buffer before each update and fail if any poison is left in
        the bucket after the replay (catches a field an updater forgot).
    strict : bool
        Raise instead of falling back to eager when no graph fits.
    record_kernels : bool
        Keep each CUDA graph's debug dump to list its kernels (and time them in one profiled
        replay): for snapshots, ``graphrt inspect`` and ``graphrt debug``. Off by default: it
        costs seconds of a cold start. The emulated engine always lists its ops.
    speculative : SpecGeometry, optional
        Draft/verify geometry; required to capture TARGET_VERIFY, DRAFT_DECODE, DRAFT_EXTEND.
    attention_chunk_size : int, optional
        Chunked-local attention (Llama-4): allocate the local buffer group for chunks of this
        many positions (a multiple of ``page_size``). ``build_stack`` takes it from the model.
    sample : bool
        Allocate the sampling group: DECODE graphs (and eager EXTEND steps) then also sample
        one token per request inside the program, returned when the batch carries
        ``Batch.sampling``. Off: programs and outputs are exactly the logits path.
    deterministic : bool
        Batch-invariant kernels (CUDA): each row's GEMMs reduce in an order that does not depend
        on the number of rows, and attention's split count does not depend on the bucket, so a
        request gets the same bits alone or batched (:mod:`graphrt.models.ops`). The CPU's fp32
        path already is; off by default (it costs speed).
    logprobs : int
        With ``sample``: each sampling step also computes, in the same graph, the chosen
        token's log-probability and the ``logprobs`` best tokens' (``GraphRuntime.logprobs``;
        :mod:`graphrt.runtime.logprobs`). 0: not computed.
    penalties : bool
        With ``sample``: keep each request row's token counts on the device and apply the
        presence, frequency and repetition penalties inside the sampling step
        (:mod:`graphrt.runtime.penalties`; ``[rows, vocab]`` int32 + bool).
    token_masks : bool
        With ``sample``: keep an allowed-token bitmask per request row (``[rows, ceil(vocab /
        32)]`` int32, :mod:`graphrt.runtime.token_mask`) applied inside the sampling step:
        constrained decoding (JSON mode, JSON schemas).
    token_buckets : tuple of int
        Token buckets of the MIXED mode (decode rows plus prompt chunks in one step, graphed per
        count of query tokens): sorted, unique, positive. A bucket of ``T`` tokens holds up to
        :meth:`mixed_rows` ``(T) = min(T, max_batch_size)`` requests. Required (non-empty) when
        ``capture_modes`` holds MIXED; the static token buffers hold the largest.
    """

    max_batch_size: int = 32
    max_context_len: int = 2048
    page_size: int = 16
    buckets: tuple[int, ...] | None = None
    capture_modes: tuple[ForwardMode, ...] = (ForwardMode.DECODE,)
    backend: str | None = None
    engine: str | None = None
    capture: str = "eager"
    warmup: int = 2
    debug: bool = False
    strict: bool = False
    record_kernels: bool = False
    speculative: SpecGeometry | None = None
    attention_chunk_size: int | None = None
    sample: bool = False
    deterministic: bool = False
    logprobs: int = 0
    penalties: bool = False
    token_masks: bool = False
    token_buckets: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.capture not in CAPTURE_POLICIES:
            raise ValueError(f"capture = {self.capture!r}: expected one of {', '.join(CAPTURE_POLICIES)}")
        if not 0 <= self.logprobs <= 64 or (self.logprobs and not self.sample):
            raise ValueError(f"logprobs = {self.logprobs}: allowed 0..64, and only with sample=True")
        if (self.penalties or self.token_masks) and not self.sample:
            raise ValueError(
                "penalties and token_masks need sample=True (they apply where tokens are sampled)"
            )
        for name in ("max_batch_size", "max_context_len", "page_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for mode in self.capture_modes:
            if not MODES[mode].graphed:
                raise ValueError(f"mode {mode.name} is eager-only and cannot be captured")
            rows_per_req(mode, self.speculative)  # raises when the geometry is missing
        check_chunk(self.attention_chunk_size, self.page_size)
        check_token_buckets(self)
        if self.attention_chunk_size is not None and self.speculative and self.speculative.topk > 1:
            raise ValueError(
                f"chunked-local attention (attention_chunk_size {self.attention_chunk_size}) "
                f"supports chains only: speculative topk {self.speculative.topk} > 1"
            )

    @property
    def max_rows_per_req(self) -> int:
        """Token rows per request the static buffers hold (the widest captured mode)."""
        return max((rows_per_req(m, self.speculative) for m in self.capture_modes), default=1)

    @property
    def max_tokens(self) -> int:
        """Token rows the static buffers hold: the widest captured mode's, or the largest token
        bucket (MIXED)."""
        return max(self.max_batch_size * self.max_rows_per_req, *self.token_buckets, 1)

    def mixed_rows(self, bucket: int) -> int:
        """Requests a MIXED graph of ``bucket`` tokens holds (each has at least one token)."""
        return min(bucket, self.max_batch_size)

    @property
    def max_pages(self) -> int:
        """Pages a request of ``max_context_len`` tokens spans (page_table width)."""
        return -(-self.max_context_len // self.page_size)


def check_token_buckets(config: RuntimeConfig) -> None:
    """Raise ``ValueError`` unless ``config.token_buckets`` are sorted unique positive ints, given
    whenever MIXED is captured."""
    buckets = config.token_buckets
    if any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in buckets):
        raise ValueError(f"token_buckets must be positive ints, got {buckets}")
    if list(buckets) != sorted(set(buckets)):
        raise ValueError(f"token_buckets must be sorted and unique, got {buckets}")
    if ForwardMode.MIXED not in config.capture_modes:
        return
    if not buckets:
        raise ValueError("capture_modes holds MIXED but token_buckets is empty: name its token buckets")


def check_chunk(chunk_size: int | None, page_size: int) -> None:
    """Raise ``ValueError`` unless ``chunk_size`` is None or a positive multiple of ``page_size``."""
    if chunk_size is None:
        return
    if chunk_size < 1:
        raise ValueError(f"attention_chunk_size must be >= 1, got {chunk_size}")
    if chunk_size % page_size:
        raise ValueError(
            f"attention_chunk_size {chunk_size} must be a multiple of page_size {page_size} "
            "(the local page table is in page units and chunks must start on a page)"
        )

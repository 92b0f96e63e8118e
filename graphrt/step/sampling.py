"""Per-request sampling parameters: validated once, on the host, before anything is written."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

from graphrt.step.ints import is_int, token_ids

#: Seeds are non-negative int64 (the sampling group stores them as int64).
MAX_SEED = 2**63 - 1
#: The largest ``top_k`` (int32's largest value; any ``top_k >= vocab`` keeps every token).
MAX_TOP_K = 2**31 - 1
#: Temperatures below this are greedy (vLLM's ``_SAMPLING_EPS``): ``z / T`` would overflow to
#: ``-inf`` for every kept token (a float32 subnormal ``T``) and the draw would be token 0.
MIN_TEMPERATURE = 1e-5
#: The most top log-probabilities a request may ask for per token (OpenAI's cap).
MAX_LOGPROBS = 20


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How one request picks each new token; the default is greedy decoding.

    Tokens are ranked by logit (equal logits: the lower id first). The filters are independent
    tests on the same ``p = softmax(logits / temperature)``: ``top_k`` keeps the ``k`` best
    ranked tokens; ``top_p`` keeps a token when the tokens ranked before it hold less than
    ``top_p`` of the mass (so the kept prefix is the smallest whose mass reaches ``top_p``);
    ``min_p`` keeps tokens with ``p >= min_p * max(p)``. A token is kept when it passes all three;
    the most likely token always does. The token is then drawn from the kept tokens with
    probabilities proportional to ``p`` (exact definition: :mod:`graphrt.runtime.sampler.draw`).

    Parameters
    ----------
    temperature : float
        ``0`` is greedy (argmax of the logits, whatever the other filters say); ``> 0`` samples.
        A temperature below :data:`MIN_TEMPERATURE` is stored as ``0`` (greedy).
    top_k : int
        Keep the ``top_k`` most likely tokens; ``0`` keeps every token. At most :data:`MAX_TOP_K`.
    top_p : float
        Nucleus mass in ``(0, 1]``; ``1`` keeps every token.
    min_p : float
        Minimum probability relative to the most likely token, in ``[0, 1]``; ``0`` disables it.
    seed : int, optional
        Random stream of the request, in ``[0, 2**63)``. A token's draw is a function of
        ``(seed, position)`` only, so it does not depend on batch mates, bucket, or graph vs eager.
        ``None``: the engine draws a fresh seed per request (not reproducible).
    stop_token_ids : sequence of int
        Generating any of these ends the request; the stop token is the last output token.
        A list, tuple, set or 1-D integer array of ints (``TypeError`` names the index of
        anything else: a float, a bool, a string).
    logprobs : int, optional
        Return each generated token's log-probability and those of the ``logprobs`` most
        likely tokens of its step (``log_softmax`` of the raw logits), in ``[0, 20]``; the
        engine must compute them (``Engine(max_logprobs=...)``). ``None``: not returned.
    presence_penalty, frequency_penalty : float
        In ``[-2, 2]``: subtracted from a token's logit once if the request generated it
        (presence), or once per time it did (frequency). 0: off.
    repetition_penalty : float
        In ``(0, 10]``: a token of the prompt or output has its logit divided by it (positive
        logits) or multiplied by it (negative ones). 1: off. Exact definitions:
        :mod:`graphrt.runtime.penalties`; the engine must keep counts (``Engine(penalties=True)``).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        _check_real("presence_penalty", self.presence_penalty, -2.0, 2.0, "[-2, 2]")
        _check_real("frequency_penalty", self.frequency_penalty, -2.0, 2.0, "[-2, 2]")
        _check_real("repetition_penalty", self.repetition_penalty, 0.0, 10.0, "(0, 10]", open_low=True)
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs, 0, MAX_LOGPROBS, f"[0, {MAX_LOGPROBS}] or None")
        _check_real("temperature", self.temperature, 0.0, math.inf, "[0, inf), finite")
        _check_int("top_k", self.top_k, 0, MAX_TOP_K, f"[0, {MAX_TOP_K}] (0: every token)")
        _check_real("top_p", self.top_p, 0.0, 1.0, "(0, 1]", open_low=True)
        _check_real("min_p", self.min_p, 0.0, 1.0, "[0, 1]")
        if self.seed is not None:
            _check_int("seed", self.seed, 0, MAX_SEED, f"[0, {MAX_SEED}]")
        unordered = isinstance(self.stop_token_ids, (set, frozenset))
        given = list(self.stop_token_ids) if unordered else self.stop_token_ids
        stops = token_ids(given, "SamplingParams.stop_token_ids")
        if unordered:
            stops.sort()  # NOTE: equal params for equal sets
        for t in stops:
            _check_int("stop_token_ids", t, 0, None, "token ids >= 0")
        object.__setattr__(self, "stop_token_ids", tuple(stops))
        if self.seed is not None:
            object.__setattr__(self, "seed", int(self.seed))
        if self.temperature < MIN_TEMPERATURE:  # NOTE: too small to divide by: greedy
            object.__setattr__(self, "temperature", 0.0)

    @property
    def penalised(self) -> bool:
        """True when any penalty is on."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0)

    @property
    def greedy(self) -> bool:
        """True when every token is the argmax (``temperature == 0``)."""
        return self.temperature == 0.0

    def check_vocab(self, vocab_size: int) -> None:
        """Raise ``ValueError`` when a stop token is not a token of the vocabulary."""
        bad = [t for t in self.stop_token_ids if t >= vocab_size]
        if bad:
            raise ValueError(
                f"SamplingParams.stop_token_ids: token id {bad[0]} out of range [0, {vocab_size})"
            )


def per_request(
    sampling: SamplingParams | Sequence[SamplingParams] | None, n: int
) -> list[SamplingParams | None]:
    """One entry per request: ``None`` (plain greedy), a shared value, or a list of ``n``."""
    if sampling is None or isinstance(sampling, SamplingParams):
        return [sampling] * n
    if not isinstance(sampling, Sequence) or isinstance(sampling, str):
        raise TypeError(
            f"sampling must be a SamplingParams, a sequence of them or None, got {type(sampling).__name__}"
        )
    params = list(sampling)
    for i, p in enumerate(params):
        if not isinstance(p, SamplingParams):
            raise TypeError(f"sampling[{i}] must be a SamplingParams, got {type(p).__name__}")
    if len(params) != n:
        raise ValueError(f"{len(params)} SamplingParams for {n} prompts")
    return params


def _check_real(name: str, value: float, lo: float, hi: float, allowed: str, open_low: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"SamplingParams.{name} must be a number, got {value!r}")
    below = value <= lo if open_low else value < lo
    if not math.isfinite(value) or below or value > hi:
        raise ValueError(f"SamplingParams.{name} = {value} is out of range: allowed {allowed}")


def _check_int(name: str, value: int, lo: int, hi: int | None, allowed: str) -> None:
    if not is_int(value):
        raise TypeError(f"SamplingParams.{name} must be an int, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        raise ValueError(f"SamplingParams.{name} = {value} is out of range: allowed {allowed}")


#: Greedy decoding: what pad rows and requests without parameters use.
GREEDY = SamplingParams()

"""The sampler a program runs inside the captured graph: logits → one token id per request row.

Every shape is a function of the graph key (``[R, V]``), nothing syncs, nothing depends on the
data's values on the host: top-k / top-p / min-p are masks over the whole vocabulary sorted
once, greedy rows are a ``torch.where`` over the argmax. Randomness is counter-based: the noise
of row ``r`` at vocabulary entry ``j`` is an integer hash of ``(seed[r], position[r], j)``, so a
request's token depends on its own logits, parameters and position only — never on its batch
mates, its bucket, or whether a graph or the eager path ran it.

The draw is Gumbel-max: ``argmax_j (logits_j / temperature + g_j)`` over the kept tokens, with
``g_j = -log(-log(u_j))`` for uniforms ``u_j``, is an exact draw from ``softmax(logits /
temperature)`` restricted to the kept set.
"""

from __future__ import annotations

import torch

from graphrt.metadata.sampling import SamplingBuffers

MASK32 = 0xFFFFFFFF
#: Mantissa bits of a float32 uniform: ``u = (h + 0.5) / 2**24`` lies strictly inside (0, 1).
UNIFORM_BITS = 24
#: Keeps the per-entry stream apart from the per-row key (any odd 32-bit constant).
VOCAB_SALT = 0x9E3779B9


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit avalanche hash (Wellons' lowbias32) on int64 tensors holding values < 2**32.

    Both multipliers are below 2**31, so every product stays below 2**63: no int64 overflow
    (whose wrap-around torch does not promise), and the result is the same on every device.
    """
    x = x ^ (x >> 16)
    x = (x * 0x21F0AAAD) & MASK32
    x = x ^ (x >> 15)
    x = (x * 0x735A2D97) & MASK32
    return x ^ (x >> 15)


def uniforms(seed: torch.Tensor, position: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Counter-based uniforms ``[R, vocab_size]`` float32 in (0, 1) from ``seed``, ``position`` [R] int64.

    Entry ``(r, j)`` is a function of ``(seed[r], position[r], j)`` only (seeds and positions
    must be non-negative). Uses 24 bits per uniform: enough for Gumbel noise and exactly
    representable in float32.
    """
    key = mix32(mix32((seed >> 32) & MASK32) ^ (seed & MASK32))
    key = mix32(key ^ (position & MASK32))
    j = torch.arange(vocab_size, device=seed.device, dtype=torch.int64)
    bits = mix32(mix32(key[:, None] ^ j[None, :]) ^ VOCAB_SALT)
    return ((bits >> (32 - UNIFORM_BITS)).float() + 0.5) * (2.0**-UNIFORM_BITS)


def keep_mask(sorted_logits: torch.Tensor, params: SamplingBuffers) -> torch.Tensor:
    """Which ranks survive top-k, then top-p, then min-p: ``[R, V]`` bool over descending logits.

    ``sorted_logits [R, V]`` float32 are already divided by the temperature. Rank 0 (the most
    likely token) always survives, so every row keeps at least one token.
    """
    vocab = sorted_logits.shape[-1]
    rank = torch.arange(vocab, device=sorted_logits.device)[None, :]
    k = torch.where(params.top_k > 0, params.top_k, vocab)[:, None]
    keep = rank < k
    probs = torch.softmax(sorted_logits.masked_fill(~keep, -torch.inf), dim=-1)
    before = probs.cumsum(dim=-1) - probs  # mass of the strictly more likely kept tokens
    top_p = params.top_p[:, None]
    # NOTE: top_p >= 1 keeps every token even where rounding pushes the running sum past 1.
    keep = keep & ((before < top_p) | (top_p >= 1.0))
    keep = keep & (probs >= params.min_p[:, None] * probs[:, :1])
    return keep | (rank == 0)


def sample(logits: torch.Tensor, params: SamplingBuffers) -> torch.Tensor:
    """One token id per row: greedy where ``temperature == 0``, else a filtered draw.

    Parameters
    ----------
    logits : [R, V] float (any float dtype; computed in float32)
    params : SamplingBuffers
        ``[R]`` rows: temperature, top_k, top_p, min_p, seed, position.

    Returns
    -------
    [R] int64 token ids. Graph-safe: no host sync, no data-dependent shape.
    """
    logits = logits.float()
    greedy = params.temperature <= 0.0
    argmax = logits.argmax(dim=-1)
    # NOTE: sort the raw logits (stable, so ties keep the lower id first, as argmax does):
    # dividing first could round two close logits into a tie and reorder them.
    ordered, ids = logits.sort(dim=-1, descending=True, stable=True)
    temperature = torch.where(greedy, 1.0, params.temperature)
    scaled = ordered / temperature[:, None]
    keep = keep_mask(scaled, params)
    noise = -torch.log(-torch.log(uniforms(params.seed, params.position, logits.shape[-1])))
    score = torch.where(keep, scaled + noise.gather(1, ids), -torch.inf)
    drawn = ids.gather(1, score.argmax(dim=-1, keepdim=True)).squeeze(1)
    return torch.where(greedy, argmax, drawn)


def filtered_probs(logits: torch.Tensor, params: SamplingBuffers) -> torch.Tensor:
    """The distribution :func:`sample` draws from, ``[R, V]`` float32 in vocabulary order.

    Greedy rows are one-hot at the argmax. For tests and for callers that want the
    probabilities the sampler uses (not used by the programs).
    """
    logits = logits.float()
    greedy = params.temperature <= 0.0
    ordered, ids = logits.sort(dim=-1, descending=True, stable=True)
    scaled = ordered / torch.where(greedy, 1.0, params.temperature)[:, None]
    keep = keep_mask(scaled, params) & ~(
        greedy[:, None] & (torch.arange(ids.shape[1], device=ids.device) > 0)[None, :]
    )
    probs = torch.softmax(scaled.masked_fill(~keep, -torch.inf), dim=-1)
    return torch.zeros_like(probs).scatter_(1, ids, probs)

"""The sampler a program runs inside the captured graph: logits → one token id per request row.

**What is drawn** (row ``r``, vocabulary ``V``, float32 logits ``z``; the Triton kernel of
:mod:`graphrt.runtime.sampler.kernel` and the torch code here compute the same thing):

- ``temperature <= 0``: greedy, the argmax of ``z`` (the lowest id among equal maxima).
- Otherwise tokens are ranked by ``z`` descending, equal logits by id ascending (``rank 0`` is
  the greedy token). With ``d_j = (z_j - max z) / temperature`` a token's *mass* is
  ``q_j = floor(exp(d_j) * 2**32)``, an int64 (its probability relative to the most likely
  token's, in units of 2**-32), so every sum of masses is exact in any order. Token ``j`` is
  **kept** when all three hold (each filter sees the same unfiltered distribution):

  - top-k: ``rank(j) < top_k`` (``top_k`` 0 or ``>= V``: off). Exactly ``top_k`` tokens.
  - top-p: the tokens ranked before ``j`` hold less than ``top_p`` of the mass:
    ``float64(sum q_i, rank(i) < rank(j)) < float64(top_p) * float64(sum q)`` (``top_p >= 1``:
    off). Among equal logits the lower id comes first.
  - min-p: ``d_j >= log(min_p)`` (float32), i.e. ``p_j >= min_p * max p`` (``min_p`` 0: off).

  Rank 0 always passes all three. The token is ``argmax_j (z_j / temperature + g_j)`` over the
  kept tokens (the lowest id among equal scores): Gumbel-max, an exact draw from
  ``softmax(z / temperature)`` restricted to them.

Randomness is counter-based: ``g_j = -log(-log(u_j))`` where ``u_j`` is an integer hash of
``(seed[r], position[r], j)`` (:func:`uniforms`), so a request's token depends on its own
logits, parameters and position only — never on its batch mates, its bucket, or whether a graph
or the eager path ran it. Every integer step is exact; float32 steps are the same IEEE operations
in both implementations (``exp`` and ``log`` may differ in the last bit between libraries, which
changes a token only where two scores tie to within that bit).

The torch code (CPU, ``GRAPHRT_FUSED_SAMPLER=0``, and the oracle of the kernel's tests) sorts the
vocabulary once per row; the kernel sorts nothing.
"""

from __future__ import annotations

import torch

from graphrt.kernels.switches import triton_enabled
from graphrt.metadata.sampling import SamplingBuffers
from graphrt.runtime.sampler.launch import check_vocab, fused_sample

MASK32 = 0xFFFFFFFF
#: Mantissa bits of a float32 uniform: ``u = (h + 0.5) / 2**24`` lies strictly inside (0, 1).
UNIFORM_BITS = 24
#: Keeps the per-entry stream apart from the per-row key (any odd 32-bit constant).
VOCAB_SALT = 0x9E3779B9
#: A token's mass is its probability relative to the most likely token in units of 2**-MASS_BITS.
MASS_BITS = 32
#: The switch of the fused kernel (:mod:`graphrt.kernels.switches`).
ENV = "GRAPHRT_FUSED_SAMPLER"


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


def fused_sampler(device: torch.device) -> bool:
    """Whether :func:`sample` on ``device`` runs the Triton kernel (CUDA, Triton importable)."""
    return triton_enabled(ENV, device)


def _plain(x: torch.Tensor) -> torch.Tensor:
    """``x`` with ``-0.0`` made ``+0.0``, so that equal values compare equal bit for bit too."""
    return torch.where(x == 0, 0.0, x)


def _prepared(
    logits: torch.Tensor, params: SamplingBuffers
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(z [R, V] float32, sampled [R] bool, temperature [R])``: temperature 1 on greedy rows."""
    check_vocab(logits.shape[-1])
    sampled = params.temperature > 0.0
    return _plain(logits.float()), sampled, torch.where(sampled, params.temperature, 1.0)


def keep_mask(logits: torch.Tensor, params: SamplingBuffers) -> torch.Tensor:
    """The kept tokens of every row as sampled rows keep them: ``[R, V]`` bool, vocabulary order.

    See the module docstring for the definition (greedy rows are treated as temperature 1).
    """
    z, _, temperature = _prepared(logits, params)
    return _kept(z, temperature, params)


def _kept(z: torch.Tensor, temperature: torch.Tensor, params: SamplingBuffers) -> torch.Tensor:
    vocab = z.shape[-1]
    ordered, ids = z.sort(dim=-1, descending=True, stable=True)
    d = (ordered - ordered[:, :1]) / temperature[:, None]
    mass = torch.floor(torch.exp(d) * 2.0**MASS_BITS).long()
    before = mass.cumsum(dim=-1) - mass  # exact: int64
    rank = torch.arange(vocab, device=z.device)[None, :]
    k = torch.where((params.top_k > 0) & (params.top_k < vocab), params.top_k, vocab)
    keep = rank < k[:, None]
    limit = torch.where(params.top_p < 1.0, params.top_p.double() * mass.sum(dim=-1).double(), torch.inf)
    keep &= before.double() < limit[:, None]
    keep &= d >= torch.log(params.min_p)[:, None]
    keep |= rank == 0
    return torch.zeros_like(keep).scatter_(1, ids, keep)


def gumbel_scores(z: torch.Tensor, temperature: torch.Tensor, params: SamplingBuffers) -> torch.Tensor:
    """``z / temperature + g`` ``[R, V]`` float32: the scores whose kept argmax is the draw."""
    noise = -torch.log(-torch.log(uniforms(params.seed, params.position, z.shape[-1])))
    return _plain(z / temperature[:, None] + noise)


def sample_torch(logits: torch.Tensor, params: SamplingBuffers) -> torch.Tensor:
    """:func:`sample` in torch ops (any device; graph-safe: no host sync, fixed shapes)."""
    z, sampled, temperature = _prepared(logits, params)
    scores = gumbel_scores(z, temperature, params)
    drawn = scores.masked_fill(~_kept(z, temperature, params), -torch.inf).argmax(dim=-1)
    return torch.where(sampled, drawn, z.argmax(dim=-1))


def sample(logits: torch.Tensor, params: SamplingBuffers) -> torch.Tensor:
    """One token id per row: greedy where ``temperature <= 0``, else a filtered draw.

    Parameters
    ----------
    logits : [R, V] float (any float dtype; computed in float32), ``V < 2**21``; finite, or
        ``-inf`` for tokens that must never be drawn (at least one finite per row).
    params : SamplingBuffers
        ``[R]`` rows: temperature, top_k, top_p, min_p, seed, position.

    Returns
    -------
    [R] int64 token ids. Graph-safe: no host sync, no data-dependent shape. On CUDA (Triton
    importable, ``GRAPHRT_FUSED_SAMPLER`` not ``0``) two Triton launches; else torch ops.
    """
    if fused_sampler(logits.device):
        return fused_sample(logits, params)
    return sample_torch(logits, params)


def filtered_probs(logits: torch.Tensor, params: SamplingBuffers) -> torch.Tensor:
    """The distribution :func:`sample` draws from, ``[R, V]`` float32 in vocabulary order.

    Greedy rows are one-hot at the argmax. For tests and for callers that want the
    probabilities the sampler uses (not used by the programs).
    """
    z, sampled, temperature = _prepared(logits, params)
    greedy = torch.zeros_like(z, dtype=torch.bool).scatter_(1, z.argmax(dim=-1, keepdim=True), True)
    keep = torch.where(sampled[:, None], _kept(z, temperature, params), greedy)
    return torch.softmax((z / temperature[:, None]).masked_fill(~keep, -torch.inf), dim=-1)

"""The in-graph sampler on its own: greedy equivalences, counter-based noise, and its distribution.

The statistical tests draw N tokens from one row of logits over a tiny vocabulary (each draw a
different position, or a different seed) and compare the counts with the distribution the
filters define, computed independently here in float64 numpy, by Pearson's chi-square test at
``ALPHA = 1e-4``: a correct sampler fails one case with probability 1e-4 over random seeds. The
seeds are fixed, so the outcome is deterministic (it passes, and keeps passing).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from graphrt import SamplingParams
from graphrt.metadata.sampling import sampling_inputs
from graphrt.runtime import make_engine
from graphrt.runtime.sampler.draw import filtered_probs, sample, uniforms

ALPHA = 1e-4
DRAWS = 20_000
LOGITS = np.array([2.0, 1.5, 1.0, 0.5, 0.0, -1.0, -0.2, 0.8])


def chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for X ~ chi-square(df): the regularized upper incomplete gamma Q(df/2, x/2)."""
    a, x = df / 2.0, x / 2.0
    if x <= 0:
        return 1.0
    log_front = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1:  # series for P(a, x)
        term = total = 1.0 / a
        n = a
        while abs(term) > 1e-15 * abs(total):
            n += 1
            term *= x / n
            total += term
        return 1.0 - math.exp(log_front) * total
    # continued fraction for Q(a, x) (modified Lentz)
    tiny = 1e-300
    b = x + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 500):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return math.exp(log_front) * h


def expected(logits: np.ndarray, p: SamplingParams) -> np.ndarray:
    """The filtered distribution, float64, written from the sampler's definition: each filter
    tests the unfiltered softmax (rank by logit, ties by id)."""
    z = logits / p.temperature
    probs = np.exp(z - z.max())
    probs /= probs.sum()
    order = np.argsort(-logits, kind="stable")
    before = np.cumsum(probs[order]) - probs[order]  # mass ranked before each token
    assert p.top_p >= 1 or np.abs(before - p.top_p).min() > 1e-3, "top_p too close to a cumulative mass"
    ranked = (np.arange(len(logits)) < (p.top_k or len(logits))) & ((before < p.top_p) | (p.top_p >= 1))
    keep = np.zeros(len(logits), dtype=bool)
    keep[order] = ranked
    keep &= probs >= p.min_p * probs.max()
    keep[order[0]] = True
    out = np.where(keep, probs, 0.0)
    return out / out.sum()


def draw(device: torch.device, p: SamplingParams, seeds: np.ndarray, positions: np.ndarray) -> np.ndarray:
    params = [SamplingParams(p.temperature, p.top_k, p.top_p, p.min_p, int(s)) for s in seeds]
    logits = torch.tensor(LOGITS, dtype=torch.float32, device=device).expand(len(seeds), -1)
    tokens = sample(logits, sampling_inputs(params, positions, device))
    return np.bincount(tokens.cpu().numpy(), minlength=len(LOGITS))


CASES = {
    "plain": SamplingParams(temperature=1.0),
    "hot": SamplingParams(temperature=2.5),
    "top_k": SamplingParams(temperature=0.7, top_k=3),
    "top_p": SamplingParams(temperature=1.0, top_p=0.8),
    "min_p": SamplingParams(temperature=1.3, min_p=0.25),
    "all": SamplingParams(temperature=1.0, top_k=5, top_p=0.9, min_p=0.1),
}


@pytest.mark.parametrize("axis", ["positions", "seeds"])
@pytest.mark.parametrize("case", list(CASES))
def test_token_frequencies_match_the_filtered_softmax(device: torch.device, case: str, axis: str) -> None:
    p = CASES[case]
    n = np.arange(DRAWS)
    seeds, positions = (
        (np.full(DRAWS, 1234), n) if axis == "positions" else (n * 7919 + 3, np.full(DRAWS, 57))
    )
    counts = draw(device, p, seeds, positions)
    want = expected(LOGITS, p)
    assert counts[want == 0].sum() == 0, f"filtered tokens drawn: {counts} for {want}"
    live = want > 0
    exp_counts = want[live] * DRAWS
    assert exp_counts.min() >= 5, "chi-square needs >= 5 expected draws per cell"
    stat = float(((counts[live] - exp_counts) ** 2 / exp_counts).sum())
    df = int(live.sum()) - 1
    pvalue = chi2_sf(stat, df) if df else 1.0
    assert pvalue > ALPHA, f"{case}/{axis}: chi2 {stat:.1f} on {df} df, p = {pvalue:.2e}; {counts} vs {want}"


def test_filtered_probs_match_the_reference(device: torch.device) -> None:
    logits = torch.tensor(LOGITS, dtype=torch.float32, device=device)[None, :]
    for p in CASES.values():
        got = filtered_probs(logits, sampling_inputs([p], [0], device))[0].cpu().double().numpy()
        np.testing.assert_allclose(got, expected(LOGITS, p), atol=1e-6)


def test_chi2_sf_against_closed_forms() -> None:
    for x in (0.5, 3.0, 18.42068, 40.0):
        assert chi2_sf(x, 2) == pytest.approx(math.exp(-x / 2), rel=1e-9)  # df 2: exp(-x/2)
        assert chi2_sf(x, 1) == pytest.approx(math.erfc(math.sqrt(x / 2)), rel=1e-9)


def test_temperature_zero_and_top_k_one_are_greedy(device: torch.device) -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 512, generator=g).to(device)
    logits[:8, 100] = logits[:8, 7] = 50.0  # ties: both pick the lower id, as argmax does
    argmax = logits.argmax(dim=-1)
    for p in (
        SamplingParams(),
        SamplingParams(temperature=0.0, top_k=5, top_p=0.3, min_p=0.5, seed=1),
        SamplingParams(temperature=1.0, top_k=1, seed=2),
        SamplingParams(temperature=1e-3, top_k=1, top_p=0.5, seed=3),
    ):
        tokens = sample(logits, sampling_inputs([p] * 64, np.arange(64), device))
        assert torch.equal(tokens, argmax), p
    assert (argmax[:8] == 7).all()


def test_noise_depends_on_seed_and_position_only(device: torch.device) -> None:
    seeds = torch.tensor([0, 1, 2**40 + 1, 2**63 - 1, 5], device=device)
    positions = torch.tensor([0, 0, 3, 1_000_000, 0], device=device)
    u = uniforms(seeds, positions, 300)
    assert u.dtype == torch.float32 and bool(((u > 0) & (u < 1)).all())
    for r in range(5):  # a row alone, or in another batch: the same numbers
        torch.testing.assert_close(
            uniforms(seeds[r : r + 1], positions[r : r + 1], 300)[0], u[r], rtol=0, atol=0
        )
    assert not torch.equal(u[0], u[1]) and not torch.equal(u[0], u[4])
    assert not torch.equal(uniforms(seeds[:1], positions[:1] + 1, 300), u[:1])
    big = uniforms(torch.arange(200, device=device), torch.zeros(200, dtype=torch.int64, device=device), 1000)
    assert abs(big.mean().item() - 0.5) < 0.005 and abs(big.var().item() - 1 / 12) < 0.002


def test_sampled_rows_need_not_share_parameters(device: torch.device) -> None:
    """Each row keeps its own filters: a top_k-2 row never leaves its two best tokens."""
    logits = torch.tensor(LOGITS, dtype=torch.float32, device=device).expand(400, -1)
    params = [
        SamplingParams(temperature=5.0, top_k=2, seed=i) if i % 2 else SamplingParams() for i in range(400)
    ]
    tokens = sample(logits, sampling_inputs(params, np.arange(400), device)).cpu()
    assert set(tokens[1::2].tolist()) == {0, 1} and set(tokens[0::2].tolist()) == {0}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": -0.5}, "temperature = -0.5 is out of range: allowed [0, inf)"),
        ({"temperature": float("nan")}, "temperature = nan"),
        ({"top_k": -1}, "top_k = -1 is out of range: allowed [0, 2147483647]"),
        ({"top_k": 2**70}, f"top_k = {2**70} is out of range: allowed [0, 2147483647]"),
        ({"top_p": 0.0}, "top_p = 0.0 is out of range: allowed (0, 1]"),
        ({"top_p": 1.5}, "top_p = 1.5"),
        ({"min_p": 1.01}, "min_p = 1.01 is out of range: allowed [0, 1]"),
        ({"seed": -3}, "seed = -3 is out of range"),
        ({"seed": 2**63}, "seed = 9223372036854775808"),
        ({"stop_token_ids": (4, -1)}, "stop_token_ids = -1"),
    ],
)
def test_sampling_params_name_the_bad_value_and_the_limit(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[").replace(")", r"\)")):
        SamplingParams(**kwargs)


def test_sampling_params_types() -> None:
    with pytest.raises(TypeError, match="top_k must be an int"):
        SamplingParams(top_k=2.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="temperature must be a number"):
        SamplingParams(temperature="hot")  # type: ignore[arg-type]
    assert SamplingParams(seed=np.int64(3), stop_token_ids=[1, 2]) == SamplingParams(
        seed=3, stop_token_ids=(1, 2)
    )
    assert SamplingParams().greedy and not SamplingParams(temperature=0.1).greedy


def test_captured_sampler_replays_with_new_parameters(device: torch.device) -> None:
    """Captured once (CUDA graph, or the emulated engine on a CPU), replayed with new logits and
    parameters written in place: the eager sampler's tokens, row by row and in any batch."""
    rows, vocab = 8, 300
    g = torch.Generator().manual_seed(1)
    logits = torch.zeros(rows, vocab, device=device)
    params = sampling_inputs([SamplingParams()] * rows, np.zeros(rows, dtype=np.int64), device)
    graph, out = make_engine(None, device, record_kernels=False).capture(
        "sampler", lambda: sample(logits, params), 1
    )
    for trial in range(3):
        new = [
            SamplingParams(0.5 + trial, top_k=7 * i, top_p=0.9, min_p=0.01 * i, seed=i + 100 * trial)
            for i in range(rows)
        ]
        new[trial] = SamplingParams()  # one greedy row
        positions = np.arange(rows) * 13 + trial
        fresh = sampling_inputs(new, positions, device)
        for name in ("temperature", "top_k", "top_p", "min_p", "seed", "position"):
            getattr(params, name).copy_(getattr(fresh, name))
        logits.copy_(torch.randn(rows, vocab, generator=g).to(device) * 3)
        graph.replay()
        eager = sample(logits, fresh)
        assert torch.equal(out, eager)
        for r in (0, 5):  # a row alone: the same token (the draw is per row)
            alone = sample(logits[r : r + 1], sampling_inputs([new[r]], positions[r : r + 1], device))
            assert alone.item() == eager[r].item()

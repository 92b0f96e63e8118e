"""The sampler's extras as Triton kernels (``graphrt.runtime.sampler.extras``) against their torch code.

On the GPU (``-m gpu``: a real vocabulary) and on the CPU under ``TRITON_INTERPRET=1`` (a small
one, several chunks). The kernels must give the torch code's tokens (they draw from the same
``z``, bit for bit: masks and penalties are the same IEEE operations), the same counts, the same
top-k ids, and log-probabilities equal within 2e-5 (float32 log-sum-exps summed in another order).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrt import SamplingParams
from graphrt.metadata.sampling import sampling_inputs
from graphrt.runtime.penalties import TokenCounts
from graphrt.runtime.sampler import extras
from graphrt.runtime.sampler.draw import ENV, fused_sampler
from graphrt.runtime.token_mask import TokenMasks
from tests.support.triton_util import triton_devices

#: Greedy and sampled rows, each penalty alone and together, and rows without any.
PARAMS = (
    SamplingParams(),
    SamplingParams(repetition_penalty=1.3),
    SamplingParams(temperature=0.8, seed=3, frequency_penalty=0.7),
    SamplingParams(presence_penalty=1.5),
    SamplingParams(temperature=1.0, top_k=20, seed=5, presence_penalty=0.4, repetition_penalty=0.8),
    SamplingParams(temperature=1.0, top_p=0.9, seed=6),
    SamplingParams(frequency_penalty=-0.5, repetition_penalty=1.1),
)
ROWS = 12  # request rows; batch row i uses request row 2 i + 1 (the last two share one)


@pytest.fixture(autouse=True)
def _interpreted_on_cpu(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    device = request.node.callspec.params.get("device") if hasattr(request.node, "callspec") else None
    if device is not None and device.type == "cpu":
        monkeypatch.setenv(ENV, "interpret")


def _vocab(device: torch.device) -> int:
    return 1000 if device.type == "cpu" else 128256


def _state(device: torch.device, vocab: int) -> tuple[TokenMasks, TokenCounts, torch.Tensor]:
    """Masks on half the rows (random bits), counts and prompts drawn at random, the batch's rows."""
    gen = torch.Generator().manual_seed(7)
    masks = TokenMasks(ROWS, vocab, device)
    words = torch.randint(-(2**31), 2**31, (ROWS, masks.words), generator=gen, dtype=torch.int64)
    words[::2] = -1
    masks.masks.copy_(words.to(torch.int32))
    counts = TokenCounts(ROWS, vocab, device)
    counts.counts.copy_(
        torch.randint(0, 4, (ROWS, vocab), generator=gen) * (torch.rand(ROWS, vocab, generator=gen) < 0.05)
    )
    counts.prompt.copy_(torch.rand(ROWS, vocab, generator=gen) < 0.05)
    rows = torch.tensor([2 * i + 1 for i in range(len(PARAMS) - 1)] + [2 * len(PARAMS) - 3], device=device)
    return masks, counts, rows


def _logits(device: torch.device, vocab: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(len(PARAMS), vocab, generator=gen) * 3
    logits[:, ::7] = 0.0  # NOTE: zeros: the repetition penalty's z > 0 edge, -0.0 in the keys
    return logits.bfloat16().to(device)


def _run(device: torch.device, fused: bool, k: int, **which: bool):
    vocab = _vocab(device)
    masks, counts, rows = _state(device, vocab)
    params = sampling_inputs(PARAMS, np.arange(len(PARAMS)) + 40, device)
    assert fused_sampler(torch.device(device)), "the switch's default (interpreted on the CPU)"
    tokens, lp = extras.sample_with_extras(
        _logits(device, vocab),
        rows,
        params,
        masks if which.get("masks", True) else None,
        counts if which.get("penalties", True) else None,
        k,
        fused=fused,
    )
    return tokens, lp, counts.counts


@pytest.mark.parametrize("device", triton_devices())
@pytest.mark.parametrize(
    ("k", "which"),
    [
        (5, {}),
        (20, {}),
        (0, {}),
        (3, {"masks": False}),
        (1, {"penalties": False}),
        (4, {"masks": False, "penalties": False}),
    ],
)
def test_kernels_match_the_torch_code(device: torch.device, k: int, which: dict) -> None:
    got_tokens, got_lp, got_counts = _run(device, True, k, **which)
    tokens, lp, counts = _run(device, False, k, **which)
    assert torch.equal(got_tokens, tokens)
    assert torch.equal(got_counts, counts), "each drawn token counted once in its request row"
    if not k:
        assert got_lp is None and lp is None
        return
    assert got_lp is not None and lp is not None and got_lp.shape == (len(PARAMS), 1 + 2 * k)
    torch.testing.assert_close(got_lp[:, : 1 + k], lp[:, : 1 + k], rtol=0, atol=2e-5)
    # NOTE: bf16 logits tie often; torch's top-k may order equal values either way, the kernel
    # puts the lower id first: each id must carry its own log-probability
    ids = got_lp[:, 1 + k :].long()
    full = torch.log_softmax(_logits(device, _vocab(device)).float(), dim=-1)
    torch.testing.assert_close(full.gather(1, ids), got_lp[:, 1 : 1 + k], rtol=0, atol=2e-5)
    tied = got_lp[:, 2 : 1 + k] == got_lp[:, 1:k]
    assert (ids[:, 1:] > ids[:, :-1])[tied].all(), "equal values: the lower id first"
    assert all(len(set(r)) == k for r in ids.tolist())


@pytest.mark.parametrize("device", triton_devices())
@pytest.mark.parametrize("fused", [True, False])
def test_masks_and_penalties_change_the_greedy_token(device: torch.device, fused: bool) -> None:
    """The greedy row under each extra alone draws what its definition says (not just the same as
    the torch code): a masked-out best token is skipped, a repeated one is penalised away."""
    vocab = _vocab(device)
    logits = torch.zeros(1, vocab)
    logits[0, 10], logits[0, 20], logits[0, 30] = 5.0, 4.0, 3.0
    masks, counts = TokenMasks(2, vocab, device), TokenCounts(2, vocab, device)
    masks.masks[1, 0] = ~(1 << 10)  # NOTE: token 10 not allowed in request row 1
    counts.counts[1, 20] = 2
    params = sampling_inputs([SamplingParams(frequency_penalty=1.0)], [0], device)
    rows = torch.tensor([1], device=device)
    tokens, lp = extras.sample_with_extras(logits.to(device), rows, params, masks, counts, 2, fused=fused)
    assert tokens.tolist() == [30], "10 masked out, 20 penalised to 2.0"
    assert counts.counts[1, 30].item() == 1
    assert lp is not None and lp[0, 3:].tolist() == [10.0, 20.0], "raw logits' best, masks aside"


@pytest.mark.parametrize("device", triton_devices())
@pytest.mark.parametrize("which", [(True, True), (True, False), (False, True)])
def test_z_is_the_torch_code_bit_for_bit(device: torch.device, which: tuple[bool, bool]) -> None:
    """``_before``'s masked, penalised logits equal :meth:`TokenMasks.apply` then
    :meth:`TokenCounts.apply` exactly (dense counts, every penalty on every row)."""
    vocab = _vocab(device)
    masks, counts, rows = _state(device, vocab)
    counts.counts.random_(0, 3, generator=torch.Generator(device).manual_seed(2))
    params = sampling_inputs(
        [SamplingParams(repetition_penalty=1.0 + i / 7, frequency_penalty=0.3 * i - 1, presence_penalty=0.9)
         for i in range(len(PARAMS))],
        np.arange(len(PARAMS)),
        device,
    )  # fmt: skip
    logits = _logits(device, vocab)
    use_masks, use_counts = masks if which[0] else None, counts if which[1] else None
    got = extras.before_draw(logits, rows, params, use_masks, use_counts, 3).z
    z = logits if use_masks is None else use_masks.apply(logits, rows)
    z = z.float() if use_counts is None else use_counts.apply(z, rows, params)
    assert torch.equal(got, z)

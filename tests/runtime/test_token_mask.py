"""Allowed-token bitmasks: xgrammar's layout (bit ``j % 32`` of word ``j // 32``), applied per
request row to the logits inside the sampling step."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrt.runtime.penalties import TokenCounts
from graphrt.runtime.token_mask import ALL, TokenMasks


def test_masks_keep_exactly_the_allowed_tokens_of_each_row() -> None:
    vocab, rows = 70, 5  # NOTE: 3 words, the last one partly past the vocabulary
    masks = TokenMasks(rows, vocab, torch.device("cpu"))
    rng = np.random.default_rng(0)
    allowed = rng.random((2, vocab)) < 0.3
    words = np.zeros((2, masks.words), dtype=np.int64)
    for r in range(2):
        for j in np.flatnonzero(allowed[r]):
            words[r, j // 32] |= 1 << (j % 32)
    _, host = masks.staging()
    host[:2] = words.astype(np.uint32).view(np.int32)
    masks.upload(np.array([3, 1]))
    logits = torch.randn(3, vocab)
    out = masks.apply(logits, torch.tensor([1, 3, 4]))
    assert torch.equal(torch.isfinite(out[0]), torch.from_numpy(allowed[1]))
    assert torch.equal(torch.isfinite(out[1]), torch.from_numpy(allowed[0]))
    assert torch.equal(out[2], logits[2])  # NOTE: an unwritten row allows every token
    kept = torch.from_numpy(allowed[1])
    assert torch.equal(out[0][kept], logits[0][kept])
    masks.staging()[1][0] = ALL
    masks.upload(np.array([1]))
    assert torch.equal(masks.apply(logits[:1], torch.tensor([1])), logits[:1])
    with pytest.raises(ValueError, match="6 mask rows written at once; the masks hold 5"):
        masks.upload(np.arange(6))


def test_uploads_write_exactly_their_rows_whatever_rows_came_before() -> None:
    """The device index is copied only when the rows change: every order of row sets still
    lands each staged row in its own request row, and leaves the others as they were."""
    masks = TokenMasks(6, 64, torch.device("cpu"))
    want = np.full((6, masks.words), ALL, dtype=np.int32)
    rng = np.random.default_rng(1)
    for rows in ([3, 1], [3, 1], [3], [1, 3], [5, 1, 3], [5], [0, 2, 4, 5]):
        words = rng.integers(-(2**31), 2**31, (len(rows), masks.words)).astype(np.int32)
        host = masks.staging()[1]
        host[: len(rows)] = words
        masks.upload(np.array(rows))
        want[rows] = words
        assert np.array_equal(masks.masks.numpy(), want), rows


def test_a_runtime_option_without_a_vocabulary_is_refused_by_name() -> None:
    cpu = torch.device("cpu")
    assert TokenMasks.of(False, 4, None, cpu) is None and TokenCounts.of(False, 4, None, cpu) is None
    assert TokenMasks.of(True, 4, 70, cpu).masks.shape[0] == 4
    with pytest.raises(ValueError, match="token_masks=True needs the model's vocab_size"):
        TokenMasks.of(True, 4, None, cpu)
    with pytest.raises(ValueError, match="penalties=True needs the model's vocab_size"):
        TokenCounts.of(True, 4, None, cpu)

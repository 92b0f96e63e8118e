"""``Engine("tiny-cross")``: each request's ``encoder_ids`` encoded at admission, DECODE replayed
from graphs, tokens equal to greedy decoding of the plain (unpaged) forward; bad encoder input
refused before anything is queued or written.
"""

from __future__ import annotations

import pytest
import torch

from graphrt import Engine
from tests.support.cross_util import plain_logits

PROMPTS = [[1, 2, 3], [9], [4, 4, 4, 4, 4]]
ENCODER = [[5, 6, 7, 8, 9], list(range(40)), [3]]
MAX_NEW = [4, 3, 3]


@pytest.fixture(scope="module")
def engine() -> Engine:
    # NOTE: bucket 2 only: one capture; a lone request runs with a pad row.
    return Engine(
        "tiny-cross", device="cpu", max_batch_size=2, max_context_len=32, page_size=4, buckets=(2,), seed=3
    )


def greedy_next(
    model: torch.nn.Module, encoder_ids: list[int], prompt: list[int], out: list[int]
) -> list[int]:
    """The plain forward's greedy token after each prefix ``prompt + out[:i]``: one causal
    forward over the whole sequence gives every prefix's last logits at once."""
    logits = plain_logits(model, encoder_ids, prompt + out[:-1])
    return logits[len(prompt) - 1 :].argmax(dim=-1).tolist()


def test_engine_generates_plain_greedy_tokens(engine: Engine) -> None:
    out = engine.generate(PROMPTS, MAX_NEW, encoder_ids=ENCODER)
    assert [len(o) for o in out] == MAX_NEW
    for e, p, o in zip(ENCODER, PROMPTS, out, strict=True):
        assert o == greedy_next(engine.model, e, p, o)
    stats = engine.stats()
    assert stats.replays.get("DECODE", 0) > 0 and not stats.fallbacks
    assert engine.encoder is not None and not engine.encoder.host_lens.any()  # NOTE: rows freed


@pytest.mark.parametrize(
    ("encoder_ids", "message"),
    [
        (None, "an encoder-decoder model needs each request's encoder input: pass encoder_ids"),
        (list(range(65)), r"encoder input of 65 tokens: must be 1\.\.64 \(max_encoder_len\)"),
        ([], r"encoder input of 0 tokens"),
        ([1, 600], r"encoder token id 600 out of range \[0, 512\)"),
        ("abc", "encoder_ids is a str"),
    ],
)
def test_bad_encoder_input_is_refused(engine: Engine, encoder_ids: object, message: str) -> None:
    before = engine.encoder.host_lens.copy()
    with pytest.raises((ValueError, TypeError), match=message):
        engine.add_request([1, 2], 3, encoder_ids=encoder_ids)  # type: ignore[arg-type]
    assert not engine.waiting and not engine.running
    assert (engine.encoder.host_lens == before).all()


def test_generate_checks_one_encoder_input_per_prompt(engine: Engine) -> None:
    with pytest.raises(ValueError, match="1 encoder_ids for 2 prompts"):
        engine.generate([[1], [2]], 2, encoder_ids=[[3]])


def test_decoder_only_model_refuses_encoder_ids() -> None:
    engine = Engine("tiny-llama", device="cpu", use_graphs=False, max_batch_size=1, max_context_len=16)
    with pytest.raises(ValueError, match="encoder_ids is for encoder-decoder models"):
        engine.add_request([1, 2], 3, encoder_ids=[1])
    assert not engine.waiting

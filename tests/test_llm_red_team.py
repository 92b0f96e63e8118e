"""``graphrt.LLM`` and its ``Engine`` attacked (issue 40's red-team rows that reach the library):
a huge ``top_k`` and too many or too long stop strings refused naming the limit, nothing queued;
a temperature too small to divide by is greedy; a bare ``str`` stop is one stop string; an
``LLM`` and its engine driven from two threads take turns; no reply ends in half a character;
the same request gives the same tokens alone, batched and streamed (``deterministic=True``:
on the CPU's fp32 path always; on CUDA through the batch-invariant kernels, ``-m gpu``).
"""

from __future__ import annotations

import threading

import pytest
import torch

from graphrt import LLM, SamplingParams
from graphrt.step.sampling import MAX_TOP_K, MIN_TEMPERATURE
from graphrt.text.stream import MAX_STOP_CHARS, MAX_STOPS, TextStream
from tests.test_llm import PROMPTS, free
from tests.tools.test_cli_generate import needs_smollm2

pytestmark = needs_smollm2
KW = {"device": "cpu", "max_batch_size": 4, "max_context_len": 128, "buckets": (1, 2, 4)}
SEEDED = SamplingParams(temperature=0.8, top_k=40, seed=7)
TOPICS = ["the sea", "a cat", "Paris", "rain", "bread", "a violin", "snow", "the moon"]
TOPICS += ["a clock", "tea", "a bridge", "chess", "a lighthouse", "autumn", "a robot", "honey"]
CHATS = [[{"role": "user", "content": f"Write one sentence about {t}."}] for t in TOPICS]


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM("smollm2", deterministic=True, **KW)


def test_a_huge_top_k_is_refused_naming_the_limit(llm: LLM) -> None:
    with pytest.raises(ValueError, match=rf"SamplingParams.top_k = {2**70} .*\[0, {MAX_TOP_K}\]"):
        SamplingParams(temperature=1.0, top_k=2**70)
    widest = SamplingParams(temperature=1.0, top_k=MAX_TOP_K, seed=3)  # NOTE: >= vocab keeps all
    every = SamplingParams(temperature=1.0, top_k=0, seed=3)
    assert llm.generate(PROMPTS[0], widest, max_new_tokens=4) == llm.generate(
        PROMPTS[0], every, max_new_tokens=4
    )
    free(llm)


def test_stop_lists_are_bounded_and_refused_before_anything_runs(llm: LLM) -> None:
    with pytest.raises(ValueError, match=f"at most {MAX_STOPS} allowed"):
        llm.generate(PROMPTS, max_new_tokens=4, stop=[f"s{i}" for i in range(MAX_STOPS + 1)])
    with pytest.raises(
        ValueError, match=f"at most {MAX_STOP_CHARS} characters: got one of {MAX_STOP_CHARS + 1}"
    ):
        llm.generate(PROMPTS[0], max_new_tokens=4, stop=["x" * (MAX_STOP_CHARS + 1)])
    with pytest.raises(TypeError, match="stop strings must be str"):
        llm.generate(PROMPTS[0], max_new_tokens=4, stop=[b"x"])  # type: ignore[list-item]
    free(llm)


def test_a_bare_string_stop_is_one_stop_string(llm: LLM) -> None:
    """Red team: ``stop="answer"`` was read as the stops ``a n s w e r``: ``' Paris'`` -> ``' P'``."""
    (full,) = llm.generate("The capital of France is", max_new_tokens=8)
    assert full.text is not None and full.text.index("Paris") < full.text.index("answer")
    assert llm.generate("The capital of France is", max_new_tokens=8, stop="zebra")[0] == full
    (cut,) = llm.generate("The capital of France is", max_new_tokens=8, stop="answer")
    assert cut.finish_reason == "stop" and cut.text == full.text[: full.text.index("answer")]
    assert "".join(llm.stream("The capital of France is", max_new_tokens=8, stop="answer")) == cut.text
    free(llm)


def test_a_temperature_too_small_to_divide_by_is_greedy(llm: LLM) -> None:
    for t in (1e-40, 1e-30, MIN_TEMPERATURE / 2):
        tiny = SamplingParams(temperature=t, seed=1)
        assert tiny.greedy and tiny.temperature == 0.0
        assert llm.generate(PROMPTS[1], tiny, max_new_tokens=6) == llm.generate(PROMPTS[1], max_new_tokens=6)
    assert not SamplingParams(temperature=MIN_TEMPERATURE).greedy
    free(llm)


def test_an_llm_and_its_engine_on_two_threads_take_turns(llm: LLM) -> None:
    ids = [llm.encode(p) for p in PROMPTS]
    want_text = llm.generate(PROMPTS, max_new_tokens=6)
    want_ids = llm.engine.generate(ids, 6)
    got: dict[str, list] = {"llm": [], "engine": []}
    errors: list[BaseException] = []

    def run(name: str, call: object) -> None:
        try:
            for _ in range(2):
                got[name].append(call())  # type: ignore[operator]
        except BaseException as err:
            errors.append(err)

    threads = [
        threading.Thread(target=run, args=("llm", lambda: llm.generate(PROMPTS, max_new_tokens=6))),
        threading.Thread(target=run, args=("engine", lambda: llm.engine.generate(ids, 6))),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert got["llm"] == [want_text] * 2 and got["engine"] == [want_ids] * 2
    free(llm)


def test_no_reply_ends_in_half_a_character(llm: LLM) -> None:
    tok = llm.tokenizer
    assert tok is not None
    ids = tok.encode("I like 🍕 pizza", add_special_tokens=False)
    pizza = next(i for i in range(len(ids)) if "🍕" in tok.decode(ids[: i + 1]))  # NOTE: its last byte
    stream = TextStream(tok)
    pieces = [stream.push(t) for t in ids[:pizza]]  # NOTE: the budget ends one byte short
    pieces.append(stream.finish())
    text = "".join(pieces)
    assert text == stream.text == "I like " and "\ufffd" not in text
    whole = TextStream(tok)
    assert "".join([*(whole.push(t) for t in ids), whole.finish()]) == "I like 🍕 pizza"


def _same_alone_batched_streamed(llm: LLM, chats: list, sampling: SamplingParams | None, new: int) -> None:
    together = llm.chat(chats, sampling, max_new_tokens=new)
    alone = [llm.chat(c, sampling, max_new_tokens=new)[0] for c in chats]
    streamed = ["".join(llm.stream(c, sampling, max_new_tokens=new)) for c in chats]
    for i, (t, a, s) in enumerate(zip(together, alone, streamed, strict=True)):
        assert t.token_ids == a.token_ids, f"chat {i}: batched {t.token_ids} alone {a.token_ids}"
        assert t.text == a.text == s, f"chat {i}"


@pytest.mark.parametrize("sampling", [None, SEEDED], ids=["greedy", "seeded"])
def test_alone_batched_and_streamed_give_the_same_tokens(llm: LLM, sampling: SamplingParams | None) -> None:
    assert llm.engine.config.deterministic and llm.engine.runtime.config.deterministic
    _same_alone_batched_streamed(llm, CHATS[:3], sampling, 6)
    free(llm)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
@pytest.mark.parametrize("sampling", [None, SEEDED], ids=["greedy", "seeded"])
def test_sixteen_chats_alone_batched_and_streamed_are_equal_on_cuda(sampling: SamplingParams | None) -> None:
    """Issue 40: on an H200 only 5 of 16 greedy replies matched alone vs batched before."""
    gpu = LLM("smollm2", deterministic=True, max_batch_size=16, max_context_len=512)
    _same_alone_batched_streamed(gpu, CHATS, sampling, 48)
    gpu.engine.close()

"""``graphrt.LLM``: text in and out over the engine — the engine's greedy tokens cut at the
model's stop token, chat through the template, streamed text equal to the reply, stop strings,
continuous batching equal to solo runs, presets without a tokenizer, bad prompts refused.
"""

from __future__ import annotations

import json

import pytest

from graphrt import LLM, Completion, SamplingParams
from graphrt.text import NoTokenizer
from graphrt.text.tokenizer import reply_tokens
from tests.tools.test_cli_generate import needs_smollm2

KW = {"device": "cpu", "max_batch_size": 4, "max_context_len": 128, "buckets": (1, 2, 4)}
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
PROMPTS = ["Once upon a time", "The three primary colours are", "def fib(n):"]


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM("smollm2", **KW)


def free(llm: LLM) -> None:
    e = llm.engine
    assert not e.running and not e.waiting and not llm.replies.active
    assert sorted(e.pool.unheld()) == list(range(e.kv.dummy_page))


@needs_smollm2
def test_chat_is_the_engines_greedy_reply_cut_at_eos(llm: LLM) -> None:
    (done,) = llm.chat(QUESTION, max_new_tokens=24)
    prompt = llm.encode_chat(QUESTION)
    raw = llm.engine.generate([prompt], 24)[0]  # NOTE: the id-level API runs on past <|im_end|>
    assert llm.tokenizer is not None and 2 in llm.tokenizer.stop_ids
    assert done.token_ids == reply_tokens(raw, llm.tokenizer.stop_ids) and len(done.token_ids) < 24
    assert done.text == llm.tokenizer.decode(done.token_ids) and "Paris" in done.text
    assert done.finish_reason == "stop" and done.completion_tokens == len(done.token_ids) + 1
    assert done.prompt_tokens == len(prompt)
    free(llm)


@needs_smollm2
def test_batch_equals_solo_runs_and_budgets_end_with_length(llm: LLM) -> None:
    together = llm.generate(PROMPTS, max_new_tokens=6)
    alone = [llm.generate(p, max_new_tokens=6)[0] for p in PROMPTS]
    assert together == alone
    for c, p in zip(together, PROMPTS, strict=True):
        assert isinstance(c, Completion) and c.prompt_tokens == len(llm.encode(p))
        assert (c.finish_reason, c.completion_tokens, len(c.token_ids)) == ("length", 6, 6)
    assert llm.generate([], max_new_tokens=3) == []
    assert llm.generate([[1, 2, 3]], max_new_tokens=3)[0] == llm.generate([1, 2, 3], max_new_tokens=3)[0]
    free(llm)


@needs_smollm2
def test_stream_joins_to_the_reply_and_closing_it_aborts(llm: LLM) -> None:
    pieces = list(llm.stream(QUESTION, max_new_tokens=24))
    assert len(pieces) > 1 and "".join(pieces) == llm.chat(QUESTION, max_new_tokens=24)[0].text
    stream = llm.stream(PROMPTS[0], max_new_tokens=50)
    next(stream)
    assert llm.engine.running or llm.engine.waiting
    stream.close()
    free(llm)


@needs_smollm2
def test_stop_strings_cut_the_text(llm: LLM) -> None:
    full = llm.generate(PROMPTS[1], max_new_tokens=16)[0]
    assert full.text
    word = full.text.split()[2]
    cut = llm.generate(PROMPTS[1], max_new_tokens=16, stop=["zzz-never", word])[0]
    assert cut.finish_reason == "stop" and cut.text == full.text[: full.text.index(word)]
    assert len(cut.token_ids) < len(full.token_ids)
    assert "".join(llm.stream(PROMPTS[1], max_new_tokens=16, stop=[word])) == cut.text
    free(llm)


@needs_smollm2
def test_seeded_sampling_repeats(llm: LLM) -> None:
    seeded = SamplingParams(temperature=1.0, seed=5)
    assert llm.generate(PROMPTS[0], seeded, max_new_tokens=8) == llm.generate(
        PROMPTS[0], seeded, max_new_tokens=8
    )


@needs_smollm2
def test_bad_prompts_are_refused_before_anything_runs(llm: LLM) -> None:
    with pytest.raises(ValueError, match=r"prompt 1: .*exceeds max_context_len 128"):
        llm.generate([[1, 2], list(range(1, 200))], max_new_tokens=4)
    with pytest.raises(TypeError, match="a prompt is a str or a list of int"):
        llm.generate([3.5], max_new_tokens=4)  # type: ignore[list-item]
    with pytest.raises(
        ValueError, match=r"prompt 0: stop strings must be non-empty and at most 256 characters"
    ):
        llm.generate("hi", max_new_tokens=4, stop=[""])
    free(llm)


def test_a_preset_takes_and_gives_token_ids() -> None:
    llm = LLM("tiny-llama", **KW)
    assert llm.tokenizer is None
    (done,) = llm.generate([[1, 2, 3]], max_new_tokens=5)
    assert done.text is None and done.token_ids == llm.engine.generate([[1, 2, 3]], 5)[0]
    assert done.finish_reason == "length"
    with pytest.raises(NoTokenizer, match="no tokenizer"):
        llm.generate("hello", max_new_tokens=4)
    with pytest.raises(ValueError, match="stop strings need a tokenizer"):
        llm.generate([1, 2], max_new_tokens=4, stop=["x"])
    free(llm)


@needs_smollm2
def test_sampling_keywords_logprobs_and_a_json_schema(llm: LLM) -> None:
    before = llm.engine.stats().generated_tokens
    keywords = llm.generate(PROMPTS[0], max_new_tokens=5, temperature=0.7, seed=1, logprobs=2)
    params = llm.generate(PROMPTS[0], SamplingParams(temperature=0.7, seed=1, logprobs=2), max_new_tokens=5)
    assert keywords == params and len(keywords[0].logprobs or []) == len(keywords[0].token_ids)
    # NOTE: stats() counts the tokens LLM (and serve) generate, not only Engine.generate's
    assert llm.engine.stats().generated_tokens - before == 2 * keywords[0].completion_tokens
    with pytest.raises(TypeError, match="not both"):
        llm.generate(PROMPTS[0], SamplingParams(), temperature=0.5)
    with pytest.raises(TypeError, match="tempreature"):
        llm.generate(PROMPTS[0], tempreature=0.5)
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["n"],
    }
    fmt = {"type": "json_schema", "json_schema": {"schema": schema}}
    (reply,) = llm.chat(
        [{"role": "user", "content": "Pick a number."}], max_new_tokens=16, response_format=fmt
    )
    assert reply.finish_reason == "stop" and isinstance(json.loads(reply.text or "")["n"], int), reply
    free(llm)


@needs_smollm2
@pytest.mark.slow
def test_chunked_prefill_keeps_the_defaults_extras_on_graphs(llm: LLM) -> None:
    """An LLM's engine keeps penalties, logprobs and token masks: with ``prefill_chunk`` its
    mixed steps replay MIXED graphs and reply what whole-prompt prefills reply."""
    chunked = LLM("smollm2", **KW, prefill_chunk=16)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    fmt = {"type": "json_schema", "json_schema": {"schema": schema}}
    ask = [{"role": "user", "content": "Pick a number and answer in JSON. " * 3}]
    kw = {"max_new_tokens": 12, "temperature": 0.7, "seed": 3, "logprobs": 2, "presence_penalty": 0.5}
    # NOTE: the short prompts decode while the long one prefills: mixed steps
    prompts = [*PROMPTS, " ".join(PROMPTS) * 3]
    whole = llm.chat(ask, response_format=fmt, **kw) + llm.generate(prompts, repetition_penalty=1.3, **kw)
    got = chunked.chat(ask, response_format=fmt, **kw) + chunked.generate(
        prompts, repetition_penalty=1.3, **kw
    )
    assert [c.token_ids for c in got] == [c.token_ids for c in whole]
    for a, b in zip(got, whole, strict=True):
        # NOTE: float32; the chunks' matmuls differ in shape from a whole prompt's (30 layers)
        assert [t.logprob for t in a.logprobs or []] == pytest.approx(
            [t.logprob for t in b.logprobs or []], abs=1e-4
        )
    stats = chunked.engine.stats()
    assert stats.mixed_steps > 0 and stats.eager == {}
    assert stats.replays["MIXED"] == stats.mixed_steps + stats.prefill_steps
    free(llm)

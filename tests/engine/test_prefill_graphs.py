"""Prefill graphs (``EngineConfig.prefill_graph_tokens``): a prefill-only step that fits a token
bucket replays a MIXED graph instead of running EXTEND eagerly, overlapped or not, and gives the
eager prefill's tokens (greedy and seeded; fp32 CPU, where graph and eager logits agree far
inside the smallest argmax margin, see test_engine), after prefix-cache hits too, across the
attention features that graph MIXED; a batch larger than the ladder runs EXTEND eagerly (no
fallback counted); a model whose backend graphs no MIXED is built anyway and prefills eagerly.
"""

from __future__ import annotations

import pytest

from graphrt import Engine, ForwardMode
from graphrt.engine.config import token_ladder
from tests.engine.test_overlap import KW, PROMPTS, SEEDED, WAVES, Log, drive
from tests.engine.test_prefix_caching import FIRST, LATER
from tests.engine.test_prefix_caching import KW as PREFIX_KW

OFF = {"prefill_graph_tokens": 0}
#: Graphs captured as steps need them (the ladder at build: test_the_eager_prefills_tokens).
LAZY = {"capture": "lazy"}


def replayed_every_prefill(engine: Engine) -> None:
    """Every prefill step of ``engine`` replayed a MIXED graph; nothing ran eagerly."""
    stats = engine.stats()
    assert stats.prefill_steps > 0 and stats.replays["MIXED"] == stats.prefill_steps
    assert stats.eager == {} and stats.fallbacks == {}


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "plain"])
@pytest.mark.parametrize("seeded", [False, True], ids=["greedy", "seeded"])
def test_the_eager_prefills_tokens(overlap: bool, seeded: bool) -> None:
    """Requests arrive in waves while others decode: each wave's prefill is a graph replay."""
    params = SEEDED if seeded else [None] * len(PROMPTS)
    eager = Engine(**KW, overlap=overlap, **OFF)  # type: ignore[arg-type]
    graphed = Engine(**KW, overlap=overlap)  # type: ignore[arg-type]
    log = Log(graphed)
    assert graphed.runtime.config.token_buckets == token_ladder(256)
    assert drive(graphed, WAVES, params) == drive(eager, WAVES, params)
    replayed_every_prefill(graphed)
    assert eager.stats().eager == {"EXTEND": eager.stats().prefill_steps}
    prefills = [rows for mode, rows, _ in log.steps if mode is ForwardMode.MIXED]
    assert len(prefills) == graphed.stats().prefill_steps and max(map(len, prefills)) > 1


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "plain"])
def test_a_prefix_hit_prefills_its_rest_in_a_graph(overlap: bool) -> None:
    """The later prompts hit the cached system prompt: each prefill computes only the rest,
    in a graph, and the tokens are those of an eager engine without caching."""
    kw = PREFIX_KW | LAZY | {"overlap": overlap}
    cold = Engine("tiny-llama", **kw, prefix_caching=False, **OFF)
    want = cold.generate(FIRST, 6) + cold.generate(LATER, 6)
    engine = Engine("tiny-llama", **kw)
    assert engine.generate(FIRST, 6) + engine.generate(LATER, 6) == want
    replayed_every_prefill(engine)
    prefix = engine.stats().prefix
    assert prefix is not None and prefix.hit_requests == 2 + len(LATER)


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "plain"])
def test_a_prefill_larger_than_the_ladder_runs_eagerly(overlap: bool) -> None:
    """Buckets up to 8 tokens: a lone 9-token prompt and a wave of 1 + 3 + 6 tokens run EXTEND
    eagerly, a lone 6-token one replays MIXED 8; no fallback is counted."""
    kw = PREFIX_KW | LAZY | {"overlap": overlap, "prefix_caching": False}
    waves = [[PROMPTS[1]], [PROMPTS[2], PROMPTS[0], PROMPTS[4]], [PROMPTS[4]]]
    eager = Engine("tiny-llama", **kw, **OFF)
    engine = Engine("tiny-llama", **kw, prefill_graph_tokens=8)
    assert engine.runtime.config.token_buckets == (1, 2, 4, 8)
    assert [engine.generate(w, 4) for w in waves] == [eager.generate(w, 4) for w in waves]
    stats = engine.stats()
    assert stats.prefill_steps == 3 and stats.fallbacks == {}
    assert stats.replays["MIXED"] == 1 and stats.eager == {"EXTEND": 2}


@pytest.mark.parametrize(
    ("model", "kw"),
    [
        ("tiny-llama-swa", {}),
        ("tiny-sinks", {}),
        ("tiny-llama-local", {}),
        ("tiny-mla", {}),
        ("tiny-llama", {"kv_cache_dtype": "fp8_e4m3"}),
    ],
    ids=["window", "sinks", "chunked-local", "mla", "fp8-kv"],
)
def test_attention_features_prefill_in_graphs(model: str, kw: dict[str, object]) -> None:
    cold = Engine(model, **PREFIX_KW, **LAZY, **kw, **OFF)
    engine = Engine(model, **PREFIX_KW, **LAZY, **kw)
    assert engine.generate(FIRST, 5) + engine.generate(LATER, 5) == (
        cold.generate(FIRST, 5) + cold.generate(LATER, 5)
    )
    replayed_every_prefill(engine)


def test_an_engine_recording_logits_prefills_eagerly() -> None:
    """``record_logits`` steps return every row's logits (``[T, V]`` float32 a prefill graph):
    no prefill graphs; the tokens are the same."""
    engine = Engine("tiny-llama", **PREFIX_KW, record_logits=True)
    assert ForwardMode.MIXED not in engine.runtime.config.capture_modes
    cold = Engine("tiny-llama", **PREFIX_KW, **OFF)
    assert engine.generate(FIRST, 5) + engine.generate(LATER, 5) == cold.generate(FIRST, 5) + cold.generate(
        LATER, 5
    )
    stats = engine.stats()
    assert "MIXED" not in stats.replays and stats.eager == {"EXTEND": stats.prefill_steps}


@pytest.mark.parametrize("model", ["tiny-dsa", "tiny-cross"])
@pytest.mark.parametrize("chunk", [None, 8], ids=["whole", "chunked"])
def test_a_model_without_mixed_graphs_prefills_eagerly(model: str, chunk: int | None) -> None:
    """Sparse MLA's backends and an encoder-decoder model graph no MIXED: the engine leaves it
    out (prefill graphs and chunked steps alike) instead of refusing the model."""
    kw = PREFIX_KW | {"max_batch_size": 2, "buckets": (1, 2), "max_context_len": 64, "prefill_chunk": chunk}
    engine = Engine(model, **kw)
    config = engine.runtime.config
    assert ForwardMode.MIXED not in config.capture_modes and config.token_buckets == ()
    extra = {"encoder_ids": [[5, 6, 7]]} if model == "tiny-cross" else {}
    whole = Engine(model, **(kw | {"prefill_chunk": None}), use_graphs=False)  # NOTE: chunks change no token
    assert engine.generate([FIRST[0][:20]], 3, **extra) == whole.generate([FIRST[0][:20]], 3, **extra)
    stats = engine.stats()
    assert "MIXED" not in stats.replays and stats.replays["DECODE"] > 0


@pytest.mark.parametrize("value", [-1, 1.5, True, "256"])
def test_bad_prefill_graph_tokens_are_refused(value: object) -> None:
    with pytest.raises(ValueError, match=rf"prefill_graph_tokens must be an int >= 0 .* got {value!r}"):
        Engine("tiny-llama", **PREFIX_KW, **LAZY, prefill_graph_tokens=value)


@pytest.mark.parametrize(
    ("kw", "buckets"),
    [
        ({}, token_ladder(256)),
        ({"max_batch_size": 300, "buckets": (1, 300)}, token_ladder(300)),
        ({"prefill_graph_tokens": None}, ()),
        ({"use_graphs": False}, ()),
        ({"prefill_chunk": 12}, token_ladder(12)),  # NOTE: its chunks hold at most 12 tokens
        # NOTE: a proposer engine prefills on the target alone, in the graphs; a draft model's not
        ({"speculative": {"method": "ngram"}}, token_ladder(256)),
        ({"speculative": {"method": "suffix"}}, token_ladder(256)),
        ({"speculative": {"method": "draft_model", "draft_model": "tiny-llama"}}, ()),
    ],
)
def test_the_ladder_captured(kw: dict[str, object], buckets: tuple[int, ...]) -> None:
    config = (PREFIX_KW | {"capture": "lazy"}) | kw
    runtime = Engine("tiny-llama", **config).runtime.config
    assert runtime.token_buckets == buckets
    assert (ForwardMode.MIXED in runtime.capture_modes) == bool(buckets)


def test_serve_passes_the_flag() -> None:
    from graphrt.cli import build_parser
    from graphrt.tools.cli.serve import llm_options

    default = llm_options(build_parser().parse_args(["serve", "--device", "cpu"]))
    off = llm_options(build_parser().parse_args(["serve", "--device", "cpu", "--prefill-graph-tokens", "0"]))
    assert default["prefill_graph_tokens"] == 256 and off["prefill_graph_tokens"] == 0

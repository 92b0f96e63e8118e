"""Sampling through the runtime and the engine: in the graph, per request, reproducible by seed.

A request's draw depends on (seed, position) only, so its tokens are the same alone or with
other requests, in any bucket, graphed or eager — given the same logits. Exact equality across
batch compositions therefore needs batch-invariant logits: float32 on the CPU agrees to ~1e-6,
far below the gap between the two best Gumbel-perturbed scores (as for greedy in test_engine).
bf16 on a GPU does not promise that (GEMMs differ per batch size), so those tests run in
float32 only; on CUDA the sampler's own invariance is tested in test_sampler (captured vs eager,
alone vs batched, on identical logits), and every test here that compares runs of identical
batches runs there too.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrt import Batch, Engine, ForwardMode, SamplingParams
from graphrt.runtime.programs import Sampled
from tests.conftest import DEVICES
from tests.support.util import Setup, build_runtime, prefill, slot_of

DECODE = ForwardMode.DECODE
HOT = SamplingParams(temperature=1.5, seed=11)
MIXED = (
    SamplingParams(temperature=1.0, seed=1),
    SamplingParams(),
    SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=2),
    SamplingParams(temperature=2.0, min_p=0.05, seed=3),
)


# ---- runtime -------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=DEVICES)
def sampled_rt(request: pytest.FixtureRequest) -> tuple[Setup, list[int]]:
    """A sampling runtime (buckets 1, 2, 4; debug poison on) with requests 0..3 prefilled."""
    setup = build_runtime(
        torch.device(request.param), max_batch_size=4, buckets=(1, 2, 4), sample=True, debug=True
    )
    lens = [9, 17, 5, 30]
    prefill(setup, range(4), lens, np.random.default_rng(0))
    return setup, lens


def step(setup: Setup, lens: list[int], rows: list[int], params: list[SamplingParams] | None) -> Batch:
    """Request ``r`` decodes token ``7 + 31 r`` at position ``lens[r]``, whoever its mates are."""
    return Batch.create(
        DECODE,
        input_ids=[7 + 31 * r for r in rows],
        seq_lens=[lens[r] + 1 for r in rows],
        req_pool_indices=rows,
        out_cache_loc=[slot_of(setup, r, lens[r]) for r in rows],
        sampling=params,
    )


def float32_only(device: torch.device) -> None:
    if device.type == "cuda":
        pytest.skip("bf16 logits are not batch-invariant; see the module docstring")


def test_decode_graph_returns_tokens_same_as_eager_in_any_bucket(sampled_rt: tuple[Setup, list[int]]) -> None:
    setup, lens = sampled_rt
    float32_only(setup.runtime.device)
    rt = setup.runtime
    full = step(setup, lens, [0, 1, 2, 3], list(MIXED))
    tokens = rt.run(full)
    assert tokens.dtype == torch.int64 and tokens.shape == (4,)
    assert torch.equal(tokens, rt.run(full, eager=True))
    for rows in ([2], [3, 0], [1, 3, 2]):  # buckets 1, 2, 4 (with a pad row); other mates
        alone = rt.run(step(setup, lens, rows, [MIXED[r] for r in rows]))
        assert alone.tolist() == [tokens[r].item() for r in rows], rows
    assert rt.stats().replays["DECODE"] >= 4 and not rt.stats().fallbacks


def test_without_sampling_the_graph_still_returns_logits(sampled_rt: tuple[Setup, list[int]]) -> None:
    setup, lens = sampled_rt
    logits = setup.runtime.run(step(setup, lens, [0, 1, 2, 3], None))
    assert logits.shape == (4, setup.model.vocab_size) and logits.is_floating_point()
    greedy = setup.runtime.run(step(setup, lens, [0, 1, 2, 3], [SamplingParams()] * 4))
    assert torch.equal(greedy, logits.argmax(dim=-1))
    seeds = [
        setup.runtime.run(step(setup, lens, [1], [SamplingParams(2.0, seed=s)])).item() for s in range(12)
    ]
    assert len(set(seeds)) > 3, f"sampling at temperature 2 should vary with the seed: {seeds}"
    assert isinstance(setup.runtime.capturer.outputs[(DECODE, 4)], Sampled)


def test_sampling_batches_are_checked(device: torch.device) -> None:
    plain = build_runtime(device, max_batch_size=2, buckets=(1, 2), capture=False)
    batch = Batch.create(DECODE, input_ids=[1], seq_lens=[1], req_pool_indices=[0], out_cache_loc=[0])
    sampled = Batch.create(
        DECODE, input_ids=[1], seq_lens=[1], req_pool_indices=[0], out_cache_loc=[0], sampling=[HOT]
    )
    with pytest.raises(ValueError, match=r"RuntimeConfig\(sample=True\)"):
        plain.runtime.run(sampled)
    with pytest.raises(ValueError, match=r"Batch.sampling has 2 entries, seq_lens has 1"):
        Batch.create(
            DECODE, input_ids=[1], seq_lens=[1], req_pool_indices=[0], out_cache_loc=[0], sampling=[HOT] * 2
        )
    assert plain.runtime.run(batch).is_floating_point()


# ---- engine --------------------------------------------------------------------------------
PROMPTS = [
    [int(t) for t in np.random.default_rng(i).integers(0, 512, n)] for i, n in enumerate((3, 9, 5, 14, 7, 2))
]
SEEDED = [SamplingParams(temperature=1.0, top_p=0.95, seed=100 + i) for i in range(len(PROMPTS))]
NEW = 10


def make_engine(device: str, use_graphs: bool = True, **kwargs: object) -> Engine:
    return Engine(
        device=device,
        use_graphs=use_graphs,
        max_batch_size=4,
        buckets=(1, 2, 4),
        max_context_len=128,
        **kwargs,
    )  # type: ignore[arg-type]


@pytest.fixture(scope="module", params=DEVICES)
def engines(request: pytest.FixtureRequest) -> tuple[Engine, Engine]:
    """A graphed and an eager engine on one device."""
    return make_engine(request.param), make_engine(request.param, use_graphs=False)


def test_greedy_equivalents_give_greedy_tokens(engines: tuple[Engine, Engine]) -> None:
    graphed, _ = engines
    greedy = graphed.generate(PROMPTS, NEW)
    assert graphed.generate(PROMPTS, NEW, SamplingParams(temperature=0.0, top_p=0.5, seed=3)) == greedy
    assert graphed.generate(PROMPTS, NEW, SamplingParams(temperature=0.9, top_k=1, seed=4)) == greedy
    assert graphed.generate(PROMPTS, NEW, SamplingParams(temperature=1.5)) != greedy


def test_same_seed_same_tokens_alone_batched_graphed_or_eager(engines: tuple[Engine, Engine]) -> None:
    graphed, eager = engines
    float32_only(graphed.device)
    batched = graphed.generate(PROMPTS, NEW, SEEDED)  # continuous batching: buckets 4, 2, 1
    assert eager.generate(PROMPTS, NEW, SEEDED) == batched
    for i in (0, 3, 5):
        assert graphed.generate([PROMPTS[i]], NEW, SEEDED[i]) == [batched[i]]
    mates = [PROMPTS[4], PROMPTS[1], [5, 6, 7, 8, 9, 10, 11]]
    other = graphed.generate([*mates, PROMPTS[2]], NEW, [HOT, SamplingParams(), HOT, SEEDED[2]])
    assert other[-1] == batched[2]
    reseeded = graphed.generate(
        PROMPTS, NEW, [SamplingParams(temperature=1.0, top_p=0.95, seed=7)] * len(PROMPTS)
    )
    assert reseeded != batched


def test_recorded_logits_engine_samples_the_same_tokens(engines: tuple[Engine, Engine]) -> None:
    graphed, _ = engines
    recorder = make_engine(str(graphed.device), record_logits=True)
    assert recorder.generate(PROMPTS, NEW, SEEDED) == graphed.generate(PROMPTS, NEW, SEEDED)
    assert len(recorder.logits) == len(PROMPTS)


def test_stop_tokens_end_a_request(engines: tuple[Engine, Engine]) -> None:
    graphed, _ = engines
    for i in (0, 2, 4):  # NOTE: alone, so the stopped run sees the free run's batches
        full = graphed.generate([PROMPTS[i]], NEW, SEEDED[i])[0]
        stop = full[3]
        params = SamplingParams(1.0, top_p=0.95, seed=100 + i, stop_token_ids=(stop, 100_000 % 512))
        out = graphed.generate([PROMPTS[i]], NEW, params)[0]
        first = min(full.index(t) for t in params.stop_token_ids if t in full)
        assert out == full[: first + 1] and out[-1] in params.stop_token_ids
    greedy = graphed.generate(PROMPTS[:1], NEW)[0]
    assert (
        graphed.generate(PROMPTS[:1], NEW, SamplingParams(stop_token_ids=(greedy[1],)))[0]
        == greedy[: greedy.index(greedy[1]) + 1]
    )
    assert not graphed.running and not graphed.waiting  # stopped requests gave back their rows


def test_engine_refuses_bad_sampling(engines: tuple[Engine, Engine]) -> None:
    graphed, _ = engines
    with pytest.raises(ValueError, match="2 SamplingParams for 3 prompts"):
        graphed.generate(PROMPTS[:3], 4, SEEDED[:2])
    with pytest.raises(ValueError, match=r"stop_token_ids: token id 512 out of range \[0, 512\)"):
        graphed.add_request([1, 2], 4, SamplingParams(stop_token_ids=(512,)))
    with pytest.raises(TypeError, match="SamplingParams or None, got dict"):
        graphed.add_request([1, 2], 4, {"temperature": 1.0})  # type: ignore[arg-type]
    assert graphed.add_request([1], 2, SamplingParams(temperature=1.0)) >= 0  # a seed is drawn
    assert graphed.waiting[-1].sampling.seed is not None
    graphed.generate([], 1)  # drain


def test_speculative_engine_samples_what_plain_decoding_samples() -> None:
    spec = {"draft_model": "tiny-llama-draft", "num_steps": 2, "topk": 1, "num_draft_tokens": 3}
    engine = make_engine("cpu", use_graphs=False, speculative=spec)
    sampled = SamplingParams(temperature=0.7, seed=1)
    plain = make_engine("cpu", use_graphs=False).generate(PROMPTS[:1], 4, sampled)
    assert engine.generate(PROMPTS[:1], 4, sampled) == plain
    greedy = engine.generate(PROMPTS[:2], NEW)
    stop = greedy[0][2]
    stopped = engine.generate(PROMPTS[:2], NEW, [SamplingParams(stop_token_ids=(stop,)), SamplingParams()])
    assert stopped == [greedy[0][: greedy[0].index(stop) + 1], greedy[1]]


def test_greedy_steps_skip_the_sampling_upload_until_something_changes() -> None:
    """``SamplingWriter``: all-greedy rows already on the device need no write and no copy; a
    sampled row, more rows, or a poison (``forget``) rewrite them."""
    from types import SimpleNamespace

    from graphrt.buffers import Dims, StaticBuffers
    from graphrt.metadata.sampling import SAMPLING_SPECS, SamplingBuffers, SamplingWriter

    dims = Dims(max_bs=8, max_tokens=8, max_pages=1, max_context_len=8)
    group = StaticBuffers("sampling", SAMPLING_SPECS, SamplingBuffers, dims, torch.device("cpu"))
    writer, positions = SamplingWriter(), np.arange(8, dtype=np.int64)

    def write(params: tuple[SamplingParams, ...], rows: int) -> bool:
        batch = SimpleNamespace(sampling=params, seq_lens=positions)
        return writer.write(group, batch, rows, rows, {})

    greedy, hot = SamplingParams(), SamplingParams(temperature=0.7, seed=3)
    assert write((greedy,) * 2, 4)  # fresh: written
    assert not write((greedy,) * 3, 4)  # same rows greedy: skipped
    assert not write((), 2)  # fewer rows: still held
    assert write((greedy,) * 5, 8)  # rows 4..8 not known yet
    assert write((hot, greedy), 2)  # a sampled row: written
    assert group.host("temperature")[0] == pytest.approx(0.7)
    assert write((greedy,), 2)  # and greedy again: rewritten
    seeded = SamplingParams(seed=5, stop_token_ids=(2,))  # greedy too: seed and stops unread
    assert not write((seeded, greedy), 2)
    group.poison()
    writer.forget()
    assert write((greedy,), 2)  # poisoned: rewritten

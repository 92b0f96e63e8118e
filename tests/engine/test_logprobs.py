"""Log-probabilities computed inside the sampling step equal ``log_softmax`` of that step's logits.

The reference is an engine that records every step's logits (``record_logits``, host
sampling): the same requests on a graphed, overlapped engine with ``max_logprobs`` give, per
token, the chosen token's log-probability and the top ones of the recorded logits (float32 on
every device: within 1e-5); greedy picks the top one; a seeded sampled request draws the same
tokens either way.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrt import Engine, SamplingParams
from graphrt.engine.logprobs import attach
from graphrt.engine.request import Request
from graphrt.runtime.logprobs import TokenLogprobs
from tests.conftest import DEVICES

#: float32 on every device: the reference engine's batches differ from the graphed one's, and bf16
#: GEMMs of other shapes move logits far more than the 1e-5 the comparison holds.
KW = {"max_batch_size": 4, "max_context_len": 96, "buckets": (1, 2, 4), "dtype": torch.float32}
PROMPTS = [np.random.default_rng(i).integers(0, 512, n).tolist() for i, n in enumerate((3, 9, 5))]
NEW = [5, 3, 6]
K = 5


def _run(engine: Engine, params: list[SamplingParams]) -> list[object]:
    rids = [engine.add_request(p, n, s) for p, n, s in zip(PROMPTS, NEW, params, strict=True)]
    reqs = [engine.scheduler.find(r) for r in rids]
    while engine.waiting or engine.running:
        engine.step()
    return reqs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("overlap", [True, False])
def test_in_graph_logprobs_equal_log_softmax_of_the_steps_logits(device: str, overlap: bool) -> None:
    params = [
        SamplingParams(logprobs=K),
        SamplingParams(temperature=0.9, top_p=0.9, seed=3, logprobs=2),
        SamplingParams(logprobs=0),
    ]
    graphed = _run(Engine(device=device, overlap=overlap, max_logprobs=K, **KW), params)
    reference = Engine(device=device, record_logits=True, max_logprobs=K, **KW)
    recorded = _run(reference, params)
    for i, (g, r) in enumerate(zip(graphed, recorded, strict=True)):
        assert g.output == r.output and len(g.logprobs) == len(g.output) == NEW[i], i
        ask = params[i].logprobs
        for step, (token, entry) in enumerate(zip(g.output, g.logprobs, strict=True)):
            lp = torch.log_softmax(reference.logits[r.rid][step].double(), dim=-1)
            assert entry.token == token
            assert entry.logprob == pytest.approx(lp[token].item(), abs=1e-5)
            best = lp.topk(ask)
            assert list(entry.top_ids) == best.indices.tolist(), (i, step)
            assert np.allclose(entry.top_logprobs, best.values.numpy(), atol=1e-5)
            if params[i].greedy and ask:
                assert entry.top_ids[0] == token  # NOTE: greedy takes the top token


def test_logprobs_are_refused_beyond_what_the_engine_computes() -> None:
    engine = Engine(device="cpu", max_logprobs=2, use_graphs=False, **KW)
    with pytest.raises(ValueError, match="logprobs = 3"):
        engine.add_request([1, 2], 2, SamplingParams(logprobs=3))
    with pytest.raises(ValueError, match="logprobs"):
        SamplingParams(logprobs=21)
    plain = Engine(device="cpu", use_graphs=False, **KW)
    with pytest.raises(ValueError, match="max_logprobs"):
        plain.add_request([1, 2], 2, SamplingParams(logprobs=0))


def test_attach_gives_each_asking_request_its_row_cut_to_what_it_asked() -> None:
    """Exact: every entry is the step's row of the packed array (float32 values as Python
    floats, ids as ints), cut to the request's own count; a request that did not ask, or whose
    output did not grow (a dropped overlapped token), gets nothing."""
    k = 4
    rng = np.random.default_rng(0)
    packed = rng.standard_normal((5, 1 + 2 * k)).astype(np.float32)
    packed[:, 1 + k :] = rng.integers(0, 50_000, (5, k))
    tokens = np.array([7, 11, 13, 17, 19], dtype=np.int64)
    asks = [k, None, 0, 2, k]
    reqs = [
        Request(i, [1], 8, output=[0, int(t)], sampling=None if a is None else SamplingParams(logprobs=a))
        for i, (t, a) in enumerate(zip(tokens, asks, strict=True))
    ]
    reqs[4].logprobs.append(TokenLogprobs(0, 0.0, (), ()))  # NOTE: already has one per token
    reqs[4].output.pop()
    attach(reqs, tokens, packed)
    for i, (r, a) in enumerate(zip(reqs, asks, strict=True)):
        if a is None or i == 4:
            assert r.logprobs == ([] if i != 4 else [TokenLogprobs(0, 0.0, (), ())])
            continue
        row = packed[i]
        want = TokenLogprobs(
            int(tokens[i]),
            float(row[0]),
            tuple(int(x) for x in row[1 + k : 1 + k + a]),
            tuple(float(x) for x in row[1 : 1 + a]),
        )
        assert r.logprobs == [want], i
        assert all(type(x) is int for x in r.logprobs[0].top_ids)


def test_overlapped_logprobs_equal_the_unoverlapped_engines_exactly() -> None:
    """The overlapped engine's log-probabilities (copied with its tokens into a ring of host
    buffers, reused step after step as the batch shrinks) are bit for bit the plain engine's."""
    params = [SamplingParams(logprobs=K), SamplingParams(logprobs=1), SamplingParams(logprobs=0)]
    kw = KW | {"max_logprobs": K}
    ahead = _run(Engine(device="cpu", overlap=True, **kw), params)
    plain = _run(Engine(device="cpu", overlap=False, **kw), params)
    for a, p in zip(ahead, plain, strict=True):
        assert a.output == p.output and len(a.logprobs) == len(a.output)
        assert a.logprobs == p.logprobs

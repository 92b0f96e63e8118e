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

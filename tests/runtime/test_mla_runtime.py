"""Dense MLA (``tiny-mla``) through GraphRuntime: replay == eager in every mode (DECODE,
TARGET_VERIFY chain and tree, DRAFT_DECODE chain and tree, DRAFT_EXTEND, IDLE), a tree verify
== each path verified causally, a chain draft == DECODE steps, FA3 == the reference (GPU), and
the Engine end to end (graphs == eager; speculative chain and tree == plain greedy).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrt import Batch, Engine, ForwardMode
from graphrt.metadata.cascade import chain_tree_mask
from graphrt.step.modes import SpecGeometry
from tests.runtime.test_spec_modes import ROWS, SCRATCH, draft_batch, verify_batch
from tests.util import Setup, build_runtime, decode_batch, prefill, slot_of, spec_batch

M = ForwardMode
CONTEXT = 64
CHAIN = SpecGeometry(num_steps=3)
TREE = SpecGeometry(num_steps=3, topk=2, num_draft_tokens=5)
MODES = (M.DECODE, M.TARGET_VERIFY, M.DRAFT_EXTEND, M.DRAFT_DECODE, M.IDLE)
_CACHE: dict[tuple[str, SpecGeometry, str | None, int], Setup] = {}


def mla(device: torch.device, spec: SpecGeometry, backend: str | None = None, page_size: int = 16) -> Setup:
    """One captured tiny-mla runtime per (device, geometry, backend, page size); tests prefill
    what they read.

    ``backend`` None: the preferred one (FA3 on an H100, the reference on the CPU).
    """
    key = (device.type, spec, backend, page_size)
    if key not in _CACHE:
        _CACHE[key] = build_runtime(
            device,
            model="tiny-mla",
            backend=backend,  # type: ignore[arg-type]
            modes=MODES,
            speculative=spec,
            buckets=(1, 4),
            max_batch_size=4,
            max_reqs=ROWS + SCRATCH,
            max_context_len=CONTEXT,
            page_size=page_size,
        )
    return _CACHE[key]


def tol(device: torch.device) -> dict[str, float]:
    return {"rtol": 2e-2, "atol": 5e-2} if device.type == "cuda" else {"rtol": 1e-4, "atol": 1e-4}


def filled(setup: Setup, rng: np.random.Generator) -> list[int]:
    """Free every row (the runtime is shared), then prefill rows ``0..ROWS-1``."""
    for row in range(ROWS + SCRATCH):
        setup.req_to_token.free(row)
    lens = [int(n) for n in rng.integers(3, CONTEXT // 2, ROWS)]
    prefill(setup, list(range(ROWS)), lens, rng)
    return lens


def mode_batches(setup: Setup, spec: SpecGeometry, reqs: list[int], lens: list[int], rng) -> list[Batch]:
    """One batch of each graphed mode for ``reqs`` (ragged accept lengths, 1 and the maximum)."""
    n = spec.num_draft_tokens
    accept = [int(a) for a in rng.integers(1, n + 1, len(reqs))]
    accept[0], accept[-1] = n, (1 if len(reqs) > 1 else accept[-1])
    return [
        decode_batch(setup, reqs, [lens[r] + 1 for r in reqs], rng),
        verify_batch(setup, spec, reqs, lens, rng),
        spec_batch(
            setup, M.DRAFT_EXTEND, reqs, [lens[r] + a for r, a in zip(reqs, accept, strict=True)], accept, rng
        ),
        draft_batch(setup, spec, reqs, lens, rng),
    ]


@pytest.mark.parametrize("spec", [CHAIN, TREE], ids=["chain", "tree"])
def test_every_mode_replay_equals_eager(device: torch.device, spec: SpecGeometry) -> None:
    setup = mla(device, spec)
    rng = np.random.default_rng(0)
    lens = filled(setup, rng)
    for reqs in ([0, 1, 2, 3], [2, 0, 1], [3]):  # full bucket, shrunk bucket, bucket 1
        for batch in mode_batches(setup, spec, reqs, lens, rng):
            graph = setup.runtime.run(batch)
            eager = setup.runtime.run(batch, eager=True)
            if batch.mode is M.DRAFT_DECODE:
                assert graph.shape == (len(reqs) * spec.topk, spec.draft_forwards)
                assert torch.equal(graph, eager), (reqs, batch.mode)
            else:
                torch.testing.assert_close(graph, eager, **tol(device), msg=f"{reqs} {batch.mode}")
    idle = Batch.create(M.IDLE, input_ids=[], seq_lens=[], req_pool_indices=[], out_cache_loc=[])
    assert setup.runtime.run(idle).shape[0] == 0
    stats = setup.runtime.stats()
    assert stats.fallbacks == {}
    assert all(stats.replays[m.name] >= 3 for m in MODES if m is not M.IDLE) and stats.replays["IDLE"] == 1


def test_tree_verify_equals_each_path_as_chain(device: torch.device) -> None:
    """Each tree token's logits (prefix + expand cascade, merged) == the last token of its own
    path prefilled causally (EXTEND) on a scratch row that aliases the prefix (page size 1: a
    page-table column names a whole page, so only single-slot pages alias any prefix)."""
    setup = mla(device, TREE, page_size=1)
    rng = np.random.default_rng(7)
    lens = filled(setup, rng)
    reqs, n = [0, 3], TREE.num_draft_tokens
    batch = verify_batch(setup, TREE, reqs, lens, rng)
    tree = setup.runtime.run(batch)
    scratch = ROWS + SCRATCH - 1
    ids = batch.input_ids.reshape(len(reqs), n)
    for b, r in enumerate(reqs):
        for t, row in enumerate(chain_tree_mask(TREE.num_steps, TREE.topk, n)):
            path = np.flatnonzero(row).tolist()  # the token's ancestors and itself, in order
            setup.req_to_token.share_prefix(r, scratch, lens[r])
            end = lens[r] + len(path)
            chain = Batch.create(
                M.EXTEND,
                input_ids=ids[b, path],
                seq_lens=[end],
                req_pool_indices=[scratch],
                out_cache_loc=[slot_of(setup, scratch, p) for p in range(lens[r], end)],
                q_lens=[len(path)],
            )
            want = setup.runtime.run(chain)[-1]
            torch.testing.assert_close(tree[b * n + t], want, **tol(device), msg=f"req {r} token {t}")


def test_chain_draft_equals_greedy_decode_steps(device: torch.device) -> None:
    """DRAFT_DECODE (one graph, argmax inside) == eager DECODE steps + argmax, token for token."""
    setup = mla(device, CHAIN)
    rng = np.random.default_rng(11)
    lens = filled(setup, rng)
    reqs = [3, 0, 2]
    batch = draft_batch(setup, CHAIN, reqs, lens, rng)
    drafted = setup.runtime.run(batch).cpu()
    tokens = batch.input_ids.tolist()
    for i in range(CHAIN.draft_forwards):
        step = Batch.create(
            M.DECODE,
            input_ids=tokens,
            seq_lens=[lens[r] + 1 + i for r in reqs],
            req_pool_indices=reqs,
            out_cache_loc=[slot_of(setup, r, lens[r] + i) for r in reqs],
        )
        tokens = setup.runtime.run(step, eager=True).argmax(-1).cpu().tolist()
        assert drafted[:, i].tolist() == tokens, f"step {i}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
@pytest.mark.parametrize("spec", [CHAIN, TREE], ids=["chain", "tree"])
def test_fa3_matches_reference(spec: SpecGeometry) -> None:
    """The same weights and batches through FA3 (with ``qv``, graphed) and the reference."""
    pytest.importorskip("sgl_kernel.flash_attn")
    device = torch.device("cuda")
    fa3, ref = mla(device, spec, "fa3"), mla(device, spec, "reference")
    assert fa3.runtime.backend.name == "fa3" and ref.runtime.backend.name == "reference"
    lens = filled(fa3, np.random.default_rng(3))
    assert filled(ref, np.random.default_rng(3)) == lens
    for reqs in ([0, 1, 2, 3], [1]):
        batches = [mode_batches(s, spec, reqs, lens, np.random.default_rng(len(reqs))) for s in (fa3, ref)]
        for got, want in zip(*batches, strict=True):
            if got.mode is M.DRAFT_DECODE:
                continue  # NOTE: argmax tokens: bf16 near-ties may differ; logits are compared
            out = fa3.runtime.run(got)
            torch.testing.assert_close(out, ref.runtime.run(want), **tol(device), msg=f"{reqs} {got.mode}")
    assert fa3.runtime.stats().fallbacks == {}


PROMPTS = [[1, 2, 3] * 9, [5, 6, 7, 8], list(range(100, 120))]
KW = {"max_batch_size": 4, "max_context_len": 64, "buckets": (1, 4)}


def test_engine_graphs_match_eager(device: torch.device) -> None:
    outs = []
    for graphs in (True, False):
        engine = Engine("tiny-mla", device=device, use_graphs=graphs, **KW)  # type: ignore[arg-type]
        outs.append(engine.generate(PROMPTS, 6))
        if graphs:
            assert engine.stats().replays["DECODE"] == 5
    assert outs[0] == outs[1]
    assert len({tuple(o) for o in outs[0]}) > 1  # the prompts lead somewhere different


@pytest.mark.parametrize("topk", [1, 2], ids=["chain", "tree"])
def test_speculative_tokens_equal_plain_greedy(topk: int) -> None:
    """A tiny-mla target with a tiny-mla draft whose head is perturbed (sometimes right,
    sometimes wrong): graphed TARGET_VERIFY, DRAFT_DECODE and DRAFT_EXTEND commit exactly
    plain greedy's tokens; a tree's accepted path is moved in the latent cache.

    NOTE: CPU only, as tests/test_engine_spec.py: in bf16 a verify step's logits are not bitwise
    a decode step's, so greedy equality would rest on argmax near-ties.
    """
    plain = Engine("tiny-mla", device="cpu", use_graphs=False, **KW).generate(PROMPTS, 8)  # type: ignore[arg-type]
    spec = {"draft_model": "tiny-mla", "num_steps": 3, "topk": topk}
    engine = Engine("tiny-mla", device="cpu", speculative=spec, **KW)  # type: ignore[arg-type]
    head = engine.draft_model.lm_head.weight
    noise = torch.randn(head.shape, generator=torch.Generator().manual_seed(0)) * head.std()
    with torch.no_grad():  # NOTE: graphs read weights in place at replay
        head.add_(noise.to(head.dtype))
    assert engine.generate(PROMPTS, 8) == plain
    stats = engine.stats()
    assert 0.0 < stats.acceptance_rate < 1.0, stats.acceptance_rate
    assert stats.replays == {"TARGET_VERIFY": stats.decode_steps} and stats.fallbacks == {}
    assert set(stats.draft_replays) == {"DRAFT_EXTEND", "DRAFT_DECODE"}

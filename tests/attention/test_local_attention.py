"""Chunked-local attention (Llama-4): the virtual batch, its buffers, and graph parity.

Chunk 32 over a 96-token context: lengths sit before, on and past the edges 32 and 64; the
verify and draft-extend tokens of one request straddle an edge. page_size 16 is the case
that catches a table in slots instead of pages (sglang #38187); page_size 1 hides it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrt import Batch, ForwardMode, GraphRuntime, PoisonLeft, RuntimeConfig
from graphrt.attention import AttendCall, LocalStep, select_backend
from graphrt.buffers import Dims, StaticBuffers
from graphrt.engine.stack import build_stack
from graphrt.kv import KVShape, PagedKVCache, ReqToToken
from graphrt.metadata.groups import Geometry
from graphrt.metadata.local import LOCAL_GROUP, LocalBuffers, LocalGeometry, derive_local
from graphrt.models import TinyLlama, preset
from graphrt.step.modes import SpecGeometry
from tests.support.paged_util import HEAD_DIM, PagedCase, oracle, paged_case, parity_step, tolerance
from tests.support.util import backends, build_runtime, decode_batch, prefill, refill, slot_of, spec_batch

C = preset("tiny-llama-local").attention_chunk_size
CONTEXT = 3 * C
SEQ_LENS = [C - 1, C, C + 1, C + 2, 2 * C, 2 * C + 1, CONTEXT]
MODES = (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND)


def local_for(case: PagedCase, page_size: int, chunk: int = C, context: int = CONTEXT) -> LocalStep:
    """The local group at the case's exact size, derived, and bound to the case's metadata."""
    dims = Dims(len(case.seq_lens), sum(case.q_lens), -(-context // page_size), context)
    geometry = LocalGeometry(chunk, page_size)
    specs = LOCAL_GROUP.specs(Geometry(local=geometry, page_size=page_size), dims)
    group = StaticBuffers("local", specs, LocalBuffers, dims, case.q.device)
    local = group.view_type(**group.full)
    derive_local(case.buffers, local, case.req_to_token, geometry, case.dummy_page)
    return LocalStep.bind(case.meta, local, chunk)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("q_lens", [[1] * 7, [1, 4, 2, 3, 4, 2, 4]], ids=["decode", "chain"])
def test_local_backends_match_oracle(device: torch.device, page_size: int, q_lens: list[int]) -> None:
    """Every backend, reading the same local buffers, equals dense chunk-masked attention."""
    case = paged_case(device, page_size, CONTEXT, SEQ_LENS, q_lens)
    step = local_for(case, page_size)
    expected = oracle(case, lambda p: p - p % C)
    assert not torch.allclose(expected, oracle(case, lambda p: 0)), "no token is past a chunk edge"
    atol = tolerance(device)
    for name in backends(device):
        call = AttendCall(case.q, case.k_cache, case.v_cache, step.meta, HEAD_DIM**-0.5)
        out = select_backend(name, device).forward(call)
        torch.testing.assert_close(
            out.double().cpu(), expected, atol=atol, rtol=atol, msg=lambda m, n=name: f"{n}: {m}"
        )


@pytest.mark.parametrize("page_size", [1, 16])
def test_local_page_table_is_in_page_units(page_size: int) -> None:
    """Each token's table row: its chunk's pages (slot // page_size), then the dummy page."""
    q_lens = [1, 4, 2, 3, 4, 2, 4]
    case = paged_case(torch.device("cpu"), page_size, CONTEXT, SEQ_LENS, q_lens)
    step = local_for(case, page_size)
    b = step.meta.buffers
    chunk_pages = C // page_size
    assert b.page_table.shape == (sum(q_lens), chunk_pages)
    t = 0
    for slots, n, q_len in zip(case.slots, SEQ_LENS, q_lens, strict=True):
        for p in range(n - q_len, n):
            start = p - p % C
            want = [
                slots[start + j * page_size] // page_size if start + j * page_size <= p else case.dummy_page
                for j in range(chunk_pages)
            ]
            assert b.page_table[t].tolist() == want, f"token at position {p}"
            assert int(b.cache_seqlens[t]) == p - start + 1
            t += 1
    assert b.cu_seqlens_q.tolist() == list(range(t + 1))
    assert step.meta.max_seqlen_q == 1 and step.meta.mode is ForwardMode.DECODE


def _local_runtime(device: torch.device, backend: str, page_size: int, **kw):
    return build_runtime(
        device,
        backend=backend,
        model="tiny-llama-local",
        page_size=page_size,
        max_batch_size=4,
        buckets=(4,),
        max_context_len=CONTEXT,
        max_reqs=6,
        **kw,
    )


@pytest.mark.parametrize("page_size", [pytest.param(1, marks=pytest.mark.slow), 16])
def test_local_replay_matches_eager_across_chunk_edges(device: torch.device, page_size: int) -> None:
    """Decode walks over the edges 32 and 64 (bs 3 in bucket 4), then verify and draft-extend
    steps whose tokens straddle an edge or end exactly on one."""
    for backend in backends(device):
        setup = _local_runtime(device, backend, page_size, modes=MODES, speculative=SpecGeometry(num_steps=3))
        runtime = setup.runtime
        rng = np.random.default_rng(page_size)
        prefill(setup, list(range(6)), [CONTEXT] * 6, rng)
        view = runtime.groups.groups["local"].view(4, 1)
        ptrs = [view.page_table.data_ptr(), view.cache_seqlens.data_ptr(), view.cu_seqlens_q.data_ptr()]
        reqs = [4, 0, 2]
        for step in range(4):  # lengths 31..34 / 63..66 / 30..33
            lens = [C - 1 + step, 2 * C - 1 + step, C - 2 + step]
            parity_step(setup, decode_batch(setup, reqs, lens, rng), device)
        for lens in ([C, C + 2, 2 * C], [C + 3, 2 * C + 1, CONTEXT]):
            refill(setup, reqs, CONTEXT)  # NOTE: the verify reads positions the decodes dropped
            tv = spec_batch(setup, ForwardMode.TARGET_VERIFY, reqs, lens, [4] * 3, rng)
            parity_step(setup, tv, device)
            de = spec_batch(setup, ForwardMode.DRAFT_EXTEND, reqs, lens, [4, 2, 1], rng)
            parity_step(setup, de, device)
        assert ptrs == [
            view.page_table.data_ptr(),
            view.cache_seqlens.data_ptr(),
            view.cu_seqlens_q.data_ptr(),
        ]
        assert runtime.stats().fallbacks == {}
        scalars = runtime.dispatcher.graphs[(ForwardMode.TARGET_VERIFY, 4)].info.host_scalars
        assert scalars["local.max_seqlen_q"] == 1 and scalars["max_seqlen_q"] == 4
        assert {k for k in scalars if k.endswith(".chunk")} == {
            "layer0.chunk",
            "layer1.chunk",
            "layer2.chunk",
        }


def test_shrinking_batch_leaves_no_stale_local_row(device: torch.device) -> None:
    """Debug mode poisons both groups before each update; bs 4 → 1 inside one bucket, then
    an IDLE step, leave no poison, and every pad row reads the dummy page only."""
    setup = _local_runtime(device, "reference", 16, debug=True, modes=(ForwardMode.DECODE, ForwardMode.IDLE))
    runtime = setup.runtime
    rng = np.random.default_rng(3)
    prefill(setup, list(range(6)), [CONTEXT] * 6, rng)
    pad = runtime.pad_values(ForwardMode.DECODE)
    for bs in (4, 3, 2, 1):
        reqs = [int(r) for r in rng.choice(6, bs, replace=False)]
        lens = [int(n) for n in rng.choice(SEQ_LENS, bs)]
        refill(setup, reqs, CONTEXT)
        try:
            parity_step(setup, decode_batch(setup, reqs, lens, rng), device)
        except PoisonLeft as exc:
            pytest.fail(f"bs {bs}: {exc}")
        assert runtime.groups.groups["local"].pad_violations(4, 1, bs, pad) == []
        view = runtime.groups.groups["local"].view(4, 1)
        assert view.cache_seqlens[bs:].tolist() == [1] * (4 - bs)
    # NOTE: an IDLE step (bs 0) replays its all-padding graph: every row reads the dummy page.
    empty = np.zeros(0, dtype=np.int64)
    idle = Batch.create(
        ForwardMode.IDLE, input_ids=empty, seq_lens=empty, req_pool_indices=empty, out_cache_loc=empty
    )
    assert runtime.run(idle).shape == (0, setup.model.vocab_size)
    assert runtime.stats().replays["IDLE"] == 1
    assert (runtime.groups.groups["local"].view(4, 1).page_table == setup.kv.dummy_page).all()


def test_chunk_must_be_a_multiple_of_page_size() -> None:
    with pytest.raises(ValueError, match="attention_chunk_size 40 must be a multiple of page_size 16"):
        RuntimeConfig(page_size=16, attention_chunk_size=40)
    with pytest.raises(ValueError, match="attention_chunk_size must be >= 1, got 0"):
        RuntimeConfig(page_size=1, attention_chunk_size=0)
    with pytest.raises(ValueError, match="supports chains only: speculative topk 2 > 1"):
        RuntimeConfig(attention_chunk_size=32, speculative=SpecGeometry(num_steps=2, topk=2))


def test_runtime_and_model_chunk_must_agree() -> None:
    config = RuntimeConfig(max_batch_size=2, max_context_len=CONTEXT, page_size=16, attention_chunk_size=64)
    with pytest.raises(ValueError, match="attention_chunk_size 64 != the model's attention_chunk_size 32"):
        build_stack("tiny-llama-local", torch.device("cpu"), config)


def test_local_model_without_local_buffers_is_refused() -> None:
    """A runtime built by hand without ``attention_chunk_size`` names the missing setting."""
    cpu, cfg = torch.device("cpu"), preset("tiny-llama-local")
    config = RuntimeConfig(max_batch_size=2, max_context_len=CONTEXT, page_size=16, backend="reference")
    model = TinyLlama.from_seed(cfg, 0, cpu, torch.float32)
    shape = KVShape(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, 16, 2 * config.max_pages + 1)
    kv = PagedKVCache(shape, torch.float32, cpu)
    r2t = ReqToToken(2, CONTEXT, 16, kv.dummy_slot, cpu)
    runtime = GraphRuntime(model, kv, r2t, config)
    assert runtime.groups.group("local") is None
    with pytest.raises(ValueError, match=r"set RuntimeConfig.attention_chunk_size=32"):
        runtime.capture()


@pytest.mark.parametrize("page_size", [1, 16])
def test_local_draft_decode_equals_greedy_decode_steps(device: torch.device, page_size: int) -> None:
    """DRAFT_DECODE re-derives the virtual batch before each draft step inside one graph:
    its drafts equal eager DECODE + argmax step by step, with steps crossing edges 32, 64."""
    spec = SpecGeometry(num_steps=4)  # 3 draft forwards
    setup = _local_runtime(
        device, "reference", page_size, modes=(ForwardMode.DRAFT_DECODE,), speculative=spec
    )
    rng = np.random.default_rng(13)
    prefill(setup, list(range(6)), [CONTEXT] * 6, rng)
    reqs, lens = [5, 1, 3], [C - 2, C - 1, 2 * C - 1]  # step i sits at position lens + i
    locs = [slot_of(setup, r, n + i) for r, n in zip(reqs, lens, strict=True) for i in range(3)]
    batch = Batch.create(
        ForwardMode.DRAFT_DECODE,
        input_ids=rng.integers(0, setup.model.vocab_size, 3),
        seq_lens=[n + 1 for n in lens],
        req_pool_indices=reqs,
        out_cache_loc=locs,
        q_lens=[1, 1, 1],
    )
    drafted = setup.runtime.run(batch).cpu()
    assert setup.runtime.stats().replays == {"DRAFT_DECODE": 1}
    tokens = batch.input_ids
    for i in range(spec.draft_forwards):
        step = Batch.create(
            ForwardMode.DECODE,
            input_ids=tokens,
            seq_lens=[n + 1 + i for n in lens],
            req_pool_indices=reqs,
            out_cache_loc=[slot_of(setup, r, n + i) for r, n in zip(reqs, lens, strict=True)],
        )
        tokens = setup.runtime.run(step, eager=True).argmax(-1).cpu().numpy()
        assert drafted[:, i].tolist() == tokens.tolist(), f"draft step {i}"

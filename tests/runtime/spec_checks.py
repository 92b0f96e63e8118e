"""Speculative-mode checks shared by the attention kinds' runtime tests (sparse MLA, dense MLA).

Each takes a captured runtime whose rows ``0..ROWS-1`` are prefilled to ``lens`` (rows past
them are scratch) and asserts one equivalence: replay == eager in every speculative mode, a
chain draft == DECODE steps with argmax, a tree draft branch == its own chain, each tree
verify token == its own path verified causally.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from graphrt import Batch, ForwardMode
from graphrt.kv.ledger import KVWrites
from graphrt.kv.move import move_slots
from graphrt.metadata.cascade import chain_tree_mask
from graphrt.step.modes import SpecGeometry
from tests.runtime.test_spec_modes import ROWS, SCRATCH, draft_batch, verify_batch
from tests.support.util import Setup, build_runtime, decode_batch, slot_of, spec_batch

M = ForwardMode
#: Request sets of the replay checks: a full bucket (4), a shrunk one, bucket 1.
REQUEST_SETS = ([0, 1, 2, 3], [2, 0, 1], [3])


def spec_runtime(
    device: torch.device,
    model: str,
    spec: SpecGeometry,
    modes: Sequence[ForwardMode],
    context: int,
    **kw: object,
) -> Setup:
    """A captured runtime of ``model`` for the checks: buckets 1 and 4, ``ROWS + SCRATCH`` rows."""
    return build_runtime(
        device,
        model=model,
        modes=modes,
        speculative=spec,
        buckets=(1, 4),
        max_batch_size=4,
        max_reqs=ROWS + SCRATCH,
        max_context_len=context,
        **kw,  # type: ignore[arg-type]
    )


def tol(device: torch.device) -> dict[str, float]:
    """bf16 on CUDA, float32 on the CPU."""
    return {"rtol": 2e-2, "atol": 5e-2} if device.type == "cuda" else {"rtol": 1e-4, "atol": 1e-4}


def scratch_chain(setup: Setup, row: int, source: int, prefix: int, pages_of: int | None = None) -> None:
    """Row ``row`` holds ``source``'s first ``prefix`` positions: whole pages shared (a prefix
    cache's alias), the partial last page copied into a page of its own (pages have one owner):
    the page row ``pages_of`` (default ``row``) would hold at that position."""
    r2t, ps = setup.req_to_token, setup.kv.page_size
    whole = prefix - prefix % ps
    r2t.share_prefix(source, row, whole)
    if whole == prefix:
        return
    positions = np.arange(whole, prefix)
    src = r2t.ledger.table[source, positions].astype(np.int64)
    owner = row if pages_of is None else pages_of
    dst = np.array([slot_of(setup, owner, int(p)) for p in positions], dtype=np.int64)
    writes = KVWrites(np.array([row]), np.array([whole]), np.array([positions.size]), dst, 0 * dst, positions)
    r2t.ledger.check(writes)
    device = r2t.table.device
    move_slots(setup.kv, torch.as_tensor(src, device=device), torch.as_tensor(dst, device=device))
    r2t.table[row, whole:prefix] = torch.as_tensor(dst, dtype=torch.int32, device=device)
    r2t.ledger.commit(writes)


def tree_paths(mask: np.ndarray) -> list[list[int]]:
    """Every token's root-to-token path (its ancestors-or-self in order) of an ancestor mask."""
    return [np.flatnonzero(row).tolist() for row in mask]


def spec_batches(
    setup: Setup, spec: SpecGeometry, reqs: list[int], lens: list[int], rng: np.random.Generator, decode: bool
) -> list[Batch]:
    """TARGET_VERIFY, DRAFT_EXTEND (ragged accept lengths, 1 and the maximum) and DRAFT_DECODE
    batches for ``reqs``; ``decode``: a DECODE batch too."""
    n = spec.num_draft_tokens
    accept = [int(a) for a in rng.integers(1, n + 1, len(reqs))]
    accept[0], accept[-1] = n, (1 if len(reqs) > 1 else accept[-1])
    extend_lens = [lens[r] + a for r, a in zip(reqs, accept, strict=True)]
    batches = [
        verify_batch(setup, spec, reqs, lens, rng),
        spec_batch(setup, M.DRAFT_EXTEND, reqs, extend_lens, accept, rng),
        draft_batch(setup, spec, reqs, lens, rng),
    ]
    return batches + ([decode_batch(setup, reqs, [lens[r] + 1 for r in reqs], rng)] if decode else [])


def check_replay_equals_eager(
    setup: Setup,
    spec: SpecGeometry,
    lens: list[int],
    rng: np.random.Generator,
    tol: dict[str, float],
    decode: bool = False,
) -> None:
    """Every mode of :func:`spec_batches` on :data:`REQUEST_SETS`: graph == eager (DRAFT_DECODE's
    argmax tokens exactly), no fallback, three replays per mode."""
    for reqs in REQUEST_SETS:
        for batch in spec_batches(setup, spec, reqs, lens, rng, decode):
            graph = setup.runtime.run(batch)
            eager = setup.runtime.run(batch, eager=True)
            if batch.mode is M.DRAFT_DECODE:
                assert graph.shape == (len(reqs) * spec.topk, spec.draft_forwards)
                assert torch.equal(graph, eager), (reqs, batch.mode)
            else:
                torch.testing.assert_close(graph, eager, **tol, msg=f"{reqs} {batch.mode}")
    stats = setup.runtime.stats()
    assert stats.fallbacks == {}
    modes = ("TARGET_VERIFY", "DRAFT_EXTEND", "DRAFT_DECODE") + (("DECODE",) if decode else ())
    assert all(stats.replays[m] >= len(REQUEST_SETS) for m in modes)


def check_chain_draft(setup: Setup, spec: SpecGeometry, reqs: list[int], lens: list[int], rng) -> None:
    """DRAFT_DECODE (one graph, argmax inside) == eager DECODE steps + argmax, token for token."""
    batch = draft_batch(setup, spec, reqs, lens, rng)
    drafted = setup.runtime.run(batch).cpu()
    tokens = batch.input_ids.tolist()
    for i in range(spec.draft_forwards):
        step = Batch.create(
            M.DECODE,
            input_ids=tokens,
            seq_lens=[lens[r] + 1 + i for r in reqs],
            req_pool_indices=reqs,
            out_cache_loc=[slot_of(setup, r, lens[r] + i) for r in reqs],
        )
        tokens = setup.runtime.run(step, eager=True).argmax(-1).cpu().tolist()
        assert drafted[:, i].tolist() == tokens, f"step {i}"


def check_tree_paths(
    setup: Setup, spec: SpecGeometry, reqs: Sequence[int], lens: list[int], rng, tol: dict[str, float]
) -> None:
    """Each tree verify token's output == the last token of its own path prefilled causally
    (EXTEND) on a scratch row holding the prefix (:func:`scratch_chain`)."""
    n = spec.num_draft_tokens
    batch = verify_batch(setup, spec, list(reqs), lens, rng)
    tree = setup.runtime.run(batch)
    scratch = ROWS + SCRATCH - 1
    ids = batch.input_ids.reshape(len(reqs), n)
    for b, r in enumerate(reqs):
        for t, path in enumerate(tree_paths(chain_tree_mask(spec.num_steps, spec.topk, n))):
            scratch_chain(setup, scratch, r, lens[r])
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
            torch.testing.assert_close(tree[b * n + t], want, **tol, msg=f"req {r} token {t}")

"""Tree drafts (topk > 1) in the engine: layout, greedy path acceptance, KV moves, exact tokens."""

from __future__ import annotations

import numpy as np
import pytest

from graphrt import Engine
from graphrt.engine.spec_tree import TreeLayout
from graphrt.engine.speculative import accept_greedy
from graphrt.step.modes import SpecGeometry

PROMPTS = [np.random.default_rng(i).integers(0, 512, 3 + 2 * i).tolist() for i in range(5)]
MAX_NEW = [12, 5, 9, 12, 1]
KW = {"device": "cpu", "max_batch_size": 4, "max_context_len": 160, "buckets": (1, 2, 4)}


def test_accept_walks_the_tree_and_moves_only_off_branch_zero() -> None:
    tree = TreeLayout.of(SpecGeometry(num_steps=3, topk=2))  # nodes: 0 | 1 2 3 | 4 5 6
    drafts = np.array([[[7, 8, 9], [5, 6, 4]], [[7, 8, 9], [5, 6, 4]], [[7, 8, 9], [5, 6, 4]]])
    predicted = np.array(
        [
            [5, 0, 0, 0, 6, 4, 3],  # branch 1 whole: bonus after node 6
            [7, 8, 1, 0, 0, 0, 0],  # branch 0, two drafts: bonus after node 2
            [2, 8, 9, 0, 6, 4, 0],  # root's token matches no branch
        ]
    )
    acc = tree.accept(drafts, predicted)
    assert acc.branch[:2].tolist() == [1, 0]
    assert acc.length.tolist() == [3, 2, 0] and acc.bonus.tolist() == [3, 1, 2]
    req, src, dst = tree.moves(acc)
    assert req.tolist() == [0, 0, 0] and src.tolist() == [4, 5, 6] and dst.tolist() == [1, 2, 3]


def test_pruned_tree_never_accepts_a_cut_node() -> None:
    tree = TreeLayout.of(SpecGeometry(num_steps=3, topk=2, num_draft_tokens=5))  # 0 | 1 2 3 | 4
    assert tree.max_depth == 3 and tree.mask(2).shape == (2, 5, 5)
    drafts = np.array([[[7, 8, 9], [5, 6, 4]]])
    acc = tree.accept(drafts, np.array([[5, 0, 0, 0, 6]]))
    assert (acc.branch[0], acc.length[0], acc.bonus[0]) == (1, 1, 6)  # node 5 was cut


def test_chain_acceptance_equals_prefix_matching() -> None:
    rng = np.random.default_rng(0)
    tree = TreeLayout.of(SpecGeometry(num_steps=4))
    drafts = rng.integers(0, 3, (64, 1, 4))
    predicted = rng.integers(0, 3, (64, 5))
    acc = tree.accept(drafts, predicted)
    assert acc.length.tolist() == accept_greedy(drafts[:, 0], predicted).tolist()
    assert acc.bonus.tolist() == predicted[np.arange(64), acc.length].tolist()
    assert tree.mask(3) is None and tree.moves(acc)[0].size == 0


@pytest.fixture(scope="module")
def plain() -> list[list[int]]:
    return Engine("tiny-llama", **KW).generate(PROMPTS, MAX_NEW)  # type: ignore[arg-type]


def tree_engine(use_graphs: bool, **options: object) -> Engine:
    return Engine("tiny-llama", use_graphs=use_graphs, speculative=dict(options), **KW)  # type: ignore[arg-type]


def reversed_guesses(engine: Engine) -> None:
    """The draft ranks its best next token last: with a copy of the target as draft, every
    verify accepts the last branch whole, so every accepted path is moved into place."""
    assert engine.spec is not None
    set_guesses = engine.spec._set_guesses

    def flipped(reqs, logits):  # type: ignore[no-untyped-def]
        set_guesses(reqs, logits)
        for r in reqs:
            r.spec.draft_tokens = r.spec.draft_tokens[::-1]

    engine.spec._set_guesses = flipped  # type: ignore[method-assign]


@pytest.mark.parametrize(
    "use_graphs", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["eager", "graphs"]
)
def test_off_branch_paths_are_moved_and_tokens_stay_exact(plain: list[list[int]], use_graphs: bool) -> None:
    engine = tree_engine(use_graphs, num_steps=2, topk=2, draft_model="tiny-llama")
    reversed_guesses(engine)
    assert engine.generate(PROMPTS, MAX_NEW) == plain
    stats = engine.stats()
    assert stats.acceptance_rate == 1.0 and stats.mean_accept_length == 3.0
    assert stats.acceptance_per_step == (1.0, 1.0)


def test_off_branch_paths_are_wrong_without_the_move(
    plain: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The move is what makes them exact: skipping it leaves node-order KV at the path's positions."""
    engine = tree_engine(False, num_steps=3, topk=2, draft_model="tiny-llama")
    reversed_guesses(engine)
    monkeypatch.setattr("graphrt.engine.speculative.move_path", lambda *a: None)
    assert engine.generate(PROMPTS, MAX_NEW) != plain


CASES = [(2, 3, 0), (4, 2, 0), (2, 3, 5), (4, 1, 0), (2, 1, 0)]


@pytest.mark.slow
@pytest.mark.parametrize(("topk", "num_steps", "num_draft_tokens"), CASES)
def test_tree_tokens_equal_plain_greedy(
    plain: list[list[int]], topk: int, num_steps: int, num_draft_tokens: int
) -> None:
    runs = {}
    for use_graphs in (True, False):
        engine = tree_engine(
            use_graphs,
            num_steps=num_steps,
            topk=topk,
            num_draft_tokens=num_draft_tokens,
            draft_model="tiny-llama-draft",
        )
        runs[use_graphs] = (engine.generate(PROMPTS, MAX_NEW), engine.stats())
    (graph_out, graph), (eager_out, eager) = runs[True], runs[False]
    assert graph_out == plain and eager_out == plain
    assert (
        graph.accepted_per_position == eager.accepted_per_position
        and graph.verify_steps == eager.verify_steps
    )
    assert graph.replays == {"TARGET_VERIFY": graph.decode_steps} and graph.fallbacks == {}
    draft_modes = {"DRAFT_EXTEND"} | ({"DRAFT_DECODE"} if num_steps > 1 else set())
    assert set(graph.draft_replays) == draft_modes and eager.replays == {}


@pytest.mark.slow
def test_tree_with_a_random_draft_is_exact_graphed(plain: list[list[int]]) -> None:
    engine = tree_engine(True, num_steps=2, topk=4, draft_model="tiny-llama-draft")
    assert engine.generate(PROMPTS, MAX_NEW) == plain
    stats = engine.stats()
    assert stats.fallbacks == {} and set(stats.draft_replays) == {"DRAFT_EXTEND", "DRAFT_DECODE"}
    assert len(stats.acceptance_per_step) == 2 and 0 < stats.mean_accept_length < 3


@pytest.mark.slow
@pytest.mark.parametrize("kv_cache_dtype", ["bf16", "fp8"])
def test_dsa_tree_moves_latent_and_indexer_keys(kv_cache_dtype: str) -> None:
    """A DSA target's moved path carries its MLA latent and its indexer keys (both read later)."""
    prompts = [np.random.default_rng(i).integers(0, 256, 3 + 2 * i).tolist() for i in range(3)]
    kw = {**KW, "max_batch_size": 2, "buckets": (1, 2), "use_graphs": False, "kv_cache_dtype": kv_cache_dtype}
    plain = Engine("tiny-dsa", **kw).generate(prompts, 8)  # type: ignore[arg-type]
    spec = {"draft_model": "tiny-dsa", "num_steps": 2, "topk": 2}
    engine = Engine("tiny-dsa", speculative=spec, **kw)  # type: ignore[arg-type]
    reversed_guesses(engine)
    assert engine.generate(prompts, 8) == plain
    assert engine.stats().acceptance_rate == 1.0

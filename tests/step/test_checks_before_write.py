"""Every check runs before the first write, on a runtime built as in docs/runtime-api.md (no vocab_size).

Each refused batch leaves the KV cache, ``req_to_token`` (device table and host ledger) and
every buffer group (device arena and host mirror) bit-identical.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrt import Batch, ForwardMode, GraphRuntime, KVShape, PagedKVCache, ReqToToken, RuntimeConfig
from graphrt.kv.ledger import KVIsolationError
from graphrt.models import TinyLlama, preset
from graphrt.step.limits import model_vocab_size
from graphrt.step.modes import SpecGeometry
from tests.step.test_bad_input import CASES, CONTEXT, MAX_REQS, PAGE, VOCAB, valid
from tests.support.state import assert_same_state, state_of
from tests.support.util import Setup, prefill, slot_of

U64_MAX = 2**64 - 1


def readme_setup(device: torch.device) -> Setup:
    """The runtime API example (docs/runtime-api.md): no ``vocab_size`` given; plus verify and draft graphs."""
    cfg = preset("tiny-llama")
    spec = SpecGeometry(num_steps=3)
    config = RuntimeConfig(
        max_batch_size=4,
        max_context_len=CONTEXT,
        page_size=PAGE,
        backend="reference",
        speculative=spec,
        capture_modes=(ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_DECODE),
        warmup=1,
    )
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = TinyLlama.from_seed(cfg, seed=0, device=device, dtype=dtype)
    pages = CONTEXT // PAGE
    shape = KVShape(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, PAGE, MAX_REQS * pages + 1)
    kv = PagedKVCache(shape, dtype, device)
    r2t = ReqToToken(MAX_REQS, CONTEXT, PAGE, kv.dummy_slot, device)
    runtime = GraphRuntime(model, kv, r2t, config)
    runtime.capture()
    s = Setup(runtime, model, kv, r2t, pages)
    prefill(s, [0, 1, 2], [4, 20, 33], np.random.default_rng(0))
    return s


@pytest.fixture(scope="module")
def setups() -> dict[str, Setup]:
    return {}


@pytest.fixture
def setup(device: torch.device, setups: dict[str, Setup]) -> Setup:
    if device.type not in setups:
        setups[device.type] = readme_setup(device)
    return setups[device.type]


def _slot(s: Setup, slot: object) -> dict:
    return valid(s) | {"out_cache_loc": [slot, valid(s)["out_cache_loc"][1]]}


#: Checks beyond tests/step/test_bad_input.py's: values as given, isolation.
MORE = {
    "u64_slot_list": (
        lambda s: _slot(s, U64_MAX),
        ValueError,
        rf"out_cache_loc: {U64_MAX} does not fit int64",
    ),
    "u64_slot_numpy": (
        lambda s: valid(s) | {"out_cache_loc": np.array([U64_MAX, 20], dtype=np.uint64)},
        ValueError,
        rf"out_cache_loc: {U64_MAX} does not fit int64",
    ),
    "u64_token_tensor": (
        lambda s: valid(s) | {"input_ids": torch.tensor([U64_MAX, 3], dtype=torch.uint64)},
        ValueError,
        rf"input_ids: {U64_MAX} does not fit int64",
    ),
    "huge_python_int": (lambda s: _slot(s, 2**70), ValueError, rf"{2**70} does not fit int64"),
    "big_slot_as_given": (
        lambda s: _slot(s, 2**40 + 4),
        ValueError,
        rf"slot {2**40 + 4} at out_cache_loc\[0\]",
    ),
    "stale_read": (
        lambda s: valid(s, rows=[3], lens=[9]),
        KVIsolationError,
        r"row 3\) reads KV positions 0\.\.7",
    ),
    "foreign_slot": (
        lambda s: valid(s, rows=[0], lens=[5]) | {"out_cache_loc": [slot_of(s, 1, 4)]},
        KVIsolationError,
        r"holds position 4 of live row 1",
    ),
}
ALL = {**CASES, **MORE}


@pytest.mark.parametrize("case", list(ALL))
@pytest.mark.parametrize("eager", [False, True], ids=["graph", "eager"])
def test_refused_before_any_write(setup: Setup, case: str, eager: bool) -> None:
    make, error, message = ALL[case]
    before, stats = state_of(setup.runtime), setup.runtime.stats()
    with pytest.raises(error, match=message):
        setup.runtime.run(Batch.create(ForwardMode.DECODE, **make(setup)), eager=eager)
    assert_same_state(setup.runtime, before)
    assert setup.runtime.stats() == stats


@pytest.mark.parametrize("eager", [False, True], ids=["graph", "eager"])
def test_verify_with_out_of_vocab_draft_is_refused(setup: Setup, eager: bool) -> None:
    """A TARGET_VERIFY whose last draft token is past the vocabulary writes nothing."""
    ids = [5, 6, 7, VOCAB + 3]
    batch = Batch.create(
        ForwardMode.TARGET_VERIFY,
        input_ids=ids,
        seq_lens=[24],
        req_pool_indices=[1],
        out_cache_loc=[slot_of(setup, 1, p) for p in range(20, 24)],
        q_lens=[4],
    )
    before = state_of(setup.runtime)
    with pytest.raises(
        ValueError, match=rf"token id out of range in input_ids: {VOCAB + 3} not in \[0, {VOCAB}\)"
    ):
        setup.runtime.run(batch, eager=eager)
    assert_same_state(setup.runtime, before)


def test_vocab_size_read_from_the_model() -> None:
    model = TinyLlama.from_seed(preset("tiny-llama"), seed=0, device=torch.device("cpu"), dtype=torch.float32)
    assert model_vocab_size(model) == VOCAB
    assert model_vocab_size(model.forward) == VOCAB  # a bound method: its module
    plain = torch.nn.Sequential(torch.nn.Embedding(77, 8), torch.nn.Linear(8, 77))
    assert model_vocab_size(plain) == 77  # no attribute: the first embedding
    assert model_vocab_size(lambda ids, pos, ctx: ids) is None


def test_negative_token_refused_without_any_vocabulary(setup: Setup) -> None:
    """With no vocabulary known at all, negative ids are still refused before any write."""
    runtime = setup.runtime
    limits = runtime.limits
    runtime.limits = type(limits)(
        limits.max_reqs, limits.max_context_len, limits.page_size, limits.num_live_slots
    )
    try:
        before = state_of(runtime)
        with pytest.raises(ValueError, match=r"token id out of range in input_ids: -4 not in \[0, "):
            runtime.run(Batch.create(ForwardMode.DECODE, **(valid(setup) | {"input_ids": [3, -4]})))
        assert_same_state(runtime, before)
    finally:
        runtime.limits = limits

"""Bad input: a clear error naming the value and the limit, and nothing written anywhere."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from graphrt import Batch, Engine, ForwardMode, RuntimeConfig
from graphrt.attention import available_backends, select_backend
from tests.support.util import Setup, build_runtime, prefill, slot_of

PAGE = 16
CONTEXT = 64
MAX_REQS = 8
# With these sizes: 4 pages per request, live pages 0..31, dummy page 32, dummy slot 512.
DUMMY_PAGE = MAX_REQS * CONTEXT // PAGE
VOCAB = 512

Kwargs = dict[str, Any]


@pytest.fixture(scope="module")
def setups() -> dict[str, Setup]:
    return {}


@pytest.fixture
def setup(device: torch.device, setups: dict[str, Setup]) -> Setup:
    """A captured runtime whose buffers and KV hold a real step (so 'unchanged' means something).

    Shared by the module's tests on one device: a rejected batch writes nothing, and each test
    compares against its own snapshot.
    """
    if device.type not in setups:
        s = build_runtime(device, page_size=PAGE, max_context_len=CONTEXT, max_reqs=MAX_REQS)
        assert s.kv.dummy_page == DUMMY_PAGE and s.model.vocab_size == VOCAB
        rng = np.random.default_rng(0)
        prefill(s, [0, 1, 2], [4, 20, 33], rng)
        s.runtime.run(Batch.create(ForwardMode.DECODE, **valid(s, rows=[2], lens=[34])))
        setups[device.type] = s
    return setups[device.type]


def valid(
    s: Setup, rows: tuple[int, ...] | list[int] = (0, 1), lens: tuple[int, ...] | list[int] = (5, 21)
) -> Kwargs:
    """Arguments of a valid DECODE batch: row ``rows[i]`` writes position ``lens[i] - 1``."""
    return {
        "input_ids": [3 + i for i in range(len(rows))],
        "seq_lens": list(lens),
        "req_pool_indices": list(rows),
        "out_cache_loc": [slot_of(s, r, n - 1) for r, n in zip(rows, lens, strict=True)],
    }


def snapshot(s: Setup) -> dict[str, torch.Tensor]:
    state = {
        "req_to_token": s.req_to_token.table.clone(),
        "arena": s.runtime.buffers.arena.clone(),
        "host_arena": s.runtime.buffers.host_arena.clone(),
    }
    for layer, (k, v) in enumerate(zip(s.kv.k, s.kv.v, strict=True)):
        state[f"k{layer}"], state[f"v{layer}"] = k.clone(), v.clone()
    return state


def assert_unchanged(s: Setup, before: dict[str, torch.Tensor]) -> None:
    after = snapshot(s)
    changed = [name for name in before if not torch.equal(before[name], after[name])]
    assert changed == [], f"a rejected batch modified {changed}"


def _past_context(s: Setup) -> Kwargs:
    kw = valid(s)
    kw["seq_lens"] = [5, CONTEXT + 1]
    return kw


def _slot(s: Setup, slot: int) -> Kwargs:
    kw = valid(s)
    kw["out_cache_loc"] = [slot, kw["out_cache_loc"][1]]
    return kw


def _with(**override: Any) -> Callable[[Setup], Kwargs]:
    return lambda s: valid(s) | override


#: id -> (batch arguments, expected error, regex on the message naming value and limit)
CASES: dict[str, tuple[Callable[[Setup], Kwargs], type[Exception], str]] = {
    "batch_too_large": (
        lambda s: valid(s, rows=list(range(9)), lens=[5] * 9),
        ValueError,
        r"batch too large: bs 9 > max_reqs 8",
    ),
    "past_max_context": (_past_context, ValueError, r"seq_len 65 > max_context_len 64"),
    "slot_in_dummy_page": (
        lambda s: _slot(s, DUMMY_PAGE * PAGE + 4),
        ValueError,
        r"page id out of range in out_cache_loc page: 32 not in \[0, 32\)",
    ),
    "slot_beyond_cache": (
        lambda s: _slot(s, 40 * PAGE + 4),
        ValueError,
        r"page id out of range in out_cache_loc page: 40 not in \[0, 32\)",
    ),
    "negative_slot": (lambda s: _slot(s, -12), ValueError, r"page id out of range.*: -1 not in \[0, 32\)"),
    "token_past_vocab": (
        _with(input_ids=[3, VOCAB]),
        ValueError,
        r"token id out of range in input_ids: 512 not in \[0, 512\)",
    ),
    "negative_token": (_with(input_ids=[-1, 3]), ValueError, r"token id .*: -1 not in \[0, 512\)"),
    "request_row_out_of_range": (
        lambda s: valid(s, rows=[0, MAX_REQS], lens=[5, 5]),
        ValueError,
        r"req_pool_indices: 8 not in \[0, 8\)",
    ),
    "duplicate_request_rows": (
        lambda s: valid(s, rows=[1, 1], lens=[21, 21]) | {"out_cache_loc": [slot_of(s, 1, 20)] * 2},
        ValueError,
        r"distinct.*row 1 appears 2 times",
    ),
    "page_misaligned_slot": (
        lambda s: _slot(s, slot_of(s, 0, 4) + 1),
        ValueError,
        r"page alignment: slot 5 for position 4 \(slot % 16 must equal position % 16\)",
    ),
    "seq_len_below_q_len": (
        _with(seq_lens=[0, 21]),
        ValueError,
        r"seq_len 0 < q_len 1",
    ),
    "float_numpy": (
        _with(input_ids=np.array([3.0, 4.0])),
        TypeError,
        r"Batch.input_ids must hold integers, got dtype float64",
    ),
    "float_tensor": (
        _with(seq_lens=torch.tensor([5.0, 21.0])),
        TypeError,
        r"Batch.seq_lens must hold integers, got dtype float32",
    ),
    "bool_in_list": (
        _with(req_pool_indices=[0, True]),
        TypeError,
        r"Batch.req_pool_indices\[1\] is True \(bool\): must be an int",
    ),
    "float_in_list": (
        _with(input_ids=[3, 4.0]),
        TypeError,
        r"Batch.input_ids\[1\] is 4.0 \(float\): must be an int",
    ),
    "meta_tensor": (
        _with(input_ids=torch.tensor([3, 4], device="meta")),
        ValueError,
        r"Batch.input_ids is on meta",
    ),
    "two_dim": (_with(input_ids=[[3, 4]]), ValueError, r"Batch.input_ids must be 1-D, got shape \(1, 2\)"),
    "rows_vs_seq_lens": (
        _with(req_pool_indices=[0]),
        ValueError,
        r"Batch.req_pool_indices has 1 rows, seq_lens has 2",
    ),
    "slots_vs_tokens": (
        _with(out_cache_loc=[4, 20, 36]),
        ValueError,
        r"Batch.out_cache_loc has 3 entries, input_ids 2",
    ),
    "tokens_vs_q_lens": (
        _with(input_ids=[3, 4, 5], out_cache_loc=[4, 20, 36]),
        ValueError,
        r"sum\(q_lens\) = 2 but there are 3 input_ids",
    ),
}
if torch.cuda.is_available():
    CASES["cuda_tensor"] = (
        _with(out_cache_loc=torch.tensor([4, 84], device="cuda")),
        ValueError,
        r"Batch.out_cache_loc is on cuda:0",
    )


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("eager", [False, True], ids=["graph", "eager"])
def test_bad_batch_rejected_before_any_write(setup: Setup, case: str, eager: bool) -> None:
    make, error, message = CASES[case]
    before = snapshot(setup)
    stats = setup.runtime.stats()
    with pytest.raises(error, match=message):
        setup.runtime.run(Batch.create(ForwardMode.DECODE, **make(setup)), eager=eager)
    assert_unchanged(setup, before)
    assert setup.runtime.stats() == stats


def test_valid_base_batch_runs(setup: Setup) -> None:
    """The cases above differ from this batch in one field; it must itself be accepted."""
    out = setup.runtime.run(Batch.create(ForwardMode.DECODE, **valid(setup)))
    assert out.shape == (2, VOCAB)
    # the last live slot (page 31) is accepted; the error cases start at page 32
    ok = valid(setup, rows=[7], lens=[CONTEXT])
    assert ok["out_cache_loc"] == [DUMMY_PAGE * PAGE - 1]
    prefill(setup, [7], [CONTEXT - 1], np.random.default_rng(7))  # the step reads row 7's KV
    setup.runtime.run(Batch.create(ForwardMode.DECODE, **ok))


def test_verify_needs_q_lens() -> None:
    with pytest.raises(ValueError, match=r"mode TARGET_VERIFY needs q_lens"):
        Batch.create(
            ForwardMode.TARGET_VERIFY,
            input_ids=[1, 2],
            seq_lens=[2],
            req_pool_indices=[0],
            out_cache_loc=[0, 1],
        )


def test_mode_must_be_a_forward_mode() -> None:
    with pytest.raises(TypeError, match=r"mode must be a ForwardMode, got 'decode'"):
        Batch.create("decode", input_ids=[1], seq_lens=[1], req_pool_indices=[0], out_cache_loc=[0])  # type: ignore[arg-type]


def test_config_rejects_eager_only_mode() -> None:
    with pytest.raises(ValueError, match=r"mode EXTEND is eager-only and cannot be captured"):
        RuntimeConfig(capture_modes=(ForwardMode.EXTEND,))


@pytest.mark.parametrize(
    "mode", [ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_DECODE, ForwardMode.DRAFT_EXTEND]
)
def test_config_speculative_mode_needs_geometry(mode: ForwardMode) -> None:
    with pytest.raises(ValueError, match=r"needs speculative geometry"):
        RuntimeConfig(capture_modes=(mode,))


@pytest.mark.parametrize("field", ["max_batch_size", "max_context_len", "page_size"])
def test_config_rejects_non_positive_sizes(field: str) -> None:
    with pytest.raises(ValueError, match=rf"{field} must be >= 1, got 0"):
        RuntimeConfig(**{field: 0})


def test_unknown_backend_lists_available(device: torch.device) -> None:
    usable = available_backends(device)
    assert "reference" in usable
    with pytest.raises(ValueError, match=r"unknown attention backend 'nope'") as info:
        select_backend("nope", device)
    for name in usable:
        assert name in str(info.value)
    with pytest.raises(ValueError, match=r"unknown attention backend 'nope'"):
        build_runtime(device, backend="nope", capture=False)


def test_unavailable_backend_lists_available(device: torch.device) -> None:
    if "fa3" in available_backends(device):
        pytest.skip("fa3 is available here")
    with pytest.raises(
        ValueError, match=rf"backend 'fa3' is not available on {device.type}.*available: reference"
    ):
        select_backend("fa3", device)


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(device="cpu", use_graphs=False, max_batch_size=2, max_context_len=32)


@pytest.mark.parametrize(
    ("prompt", "max_new", "message"),
    [
        ([1, VOCAB, 2], 4, r"token id 512 out of range \[0, 512\)"),
        ([-3], 4, r"token id -3 out of range \[0, 512\)"),
        ([], 4, r"prompt is empty"),
        (list(range(40)), 1, r"prompt of 40 tokens \+ max_new_tokens 1 exceeds max_context_len 32"),
        (list(range(30)), 3, r"prompt of 30 tokens \+ max_new_tokens 3 exceeds max_context_len 32"),
        ([1, 2], 0, r"max_new_tokens must be >= 1, got 0"),
    ],
)
def test_engine_rejects_bad_request(engine: Engine, prompt: list[int], max_new: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        engine.add_request(prompt, max_new)
    assert not engine.waiting and not engine.running


def test_engine_accepts_prompt_filling_the_context(engine: Engine) -> None:
    rid = engine.add_request(list(range(29)), 3)  # 29 + 3 == max_context_len
    assert [r.rid for r in engine.waiting] == [rid]
    engine.waiting.clear()


def test_engine_generate_length_mismatch(engine: Engine) -> None:
    with pytest.raises(ValueError, match=r"2 max_new_tokens for 3 prompts"):
        engine.generate([[1], [2], [3]], [1, 2])
    assert not engine.waiting

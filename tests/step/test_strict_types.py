"""Issue 24.4 below the engine: ``Batch.create``, ``SamplingParams`` and the CLI refuse what
they used to convert (a float id truncated, ``True`` taken as 1, a string split into digits),
with a ``TypeError`` (one line and exit 2 through the CLI) naming the argument and the index.
The engine's door (``Engine.generate``) is tests/engine/test_shared_engine.py; the same
checks (graphrt/step/ints.py) serve all of them."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from graphrt import Batch, ForwardMode, SamplingParams
from graphrt.cli import main
from graphrt.step.ints import count, token_ids

GOOD = {"input_ids": [3, 4], "seq_lens": [5, 6], "req_pool_indices": [0, 1], "out_cache_loc": [4, 21]}
BATCHES: dict[str, tuple[dict[str, Any], str]] = {
    "bool id": ({"input_ids": [3, True]}, r"Batch\.input_ids\[1\] is True \(bool\): must be an int"),
    "float id": ({"input_ids": [3.0, 4]}, r"Batch\.input_ids\[0\] is 3\.0 \(float\): must be an int"),
    "string id": ({"input_ids": ("3", 4)}, r"Batch\.input_ids\[0\] is '3' \(str\): must be an int"),
    "numpy bool": ({"seq_lens": [5, np.bool_(True)]}, r"Batch\.seq_lens\[1\] is np\.True_ \(bool\)"),
    "bool row": ({"req_pool_indices": [0, False]}, r"Batch\.req_pool_indices\[1\] is False \(bool\)"),
    "float lens": (
        {"seq_lens": np.array([5.0, 6.0])},
        r"Batch\.seq_lens must hold integers, got dtype float64",
    ),
    "bool array": (
        {"out_cache_loc": np.array([True, False])},
        r"Batch\.out_cache_loc must hold integers, got dtype bool",
    ),
    "float tensor": (
        {"input_ids": torch.tensor([3.0, 4.0])},
        r"Batch\.input_ids must hold integers, got dtype float32",
    ),
    "string": ({"input_ids": "34"}, r"Batch\.input_ids must hold integers, got dtype <U2"),
}


@pytest.mark.parametrize("case", list(BATCHES))
def test_batch_create_refuses_non_integers(case: str) -> None:
    change, message = BATCHES[case]
    with pytest.raises(TypeError, match=message):
        Batch.create(ForwardMode.DECODE, **(GOOD | change))


def test_batch_create_takes_integer_arrays_and_numpy_ints() -> None:
    a = Batch.create(ForwardMode.DECODE, **GOOD)
    b = Batch.create(
        ForwardMode.DECODE,
        input_ids=np.array([3, 4], dtype=np.int32),
        seq_lens=torch.tensor([5, 6]),
        req_pool_indices=[np.int64(0), np.uint8(1)],
        out_cache_loc=(4, 21),
    )
    for name in GOOD:
        assert getattr(a, name).tolist() == getattr(b, name).tolist()


SAMPLING: dict[str, tuple[dict[str, Any], str]] = {
    "stop ids string": ({"stop_token_ids": "12"}, r"stop_token_ids is a str; token ids are a sequence"),
    "stop id bool": ({"stop_token_ids": [2, True]}, r"stop_token_ids\[1\] is True \(bool\)"),
    "stop id float": ({"stop_token_ids": (2.0,)}, r"stop_token_ids\[0\] is 2\.0 \(float\)"),
    "stop ids float array": ({"stop_token_ids": np.array([2.0])}, r"stop_token_ids\[0\] is 2\.0 \(float\)"),
    "stop ids int": (
        {"stop_token_ids": 7},
        r"stop_token_ids must be a sequence of integer token ids, got int",
    ),
    "top_k float": ({"top_k": 2.0}, r"top_k must be an int, got 2\.0"),
    "seed bool": ({"seed": True}, r"seed must be an int, got True"),
    "temperature string": ({"temperature": "0.5"}, r"temperature must be a number, got '0\.5'"),
}


@pytest.mark.parametrize("case", list(SAMPLING))
def test_sampling_params_refuse_non_integers(case: str) -> None:
    kwargs, message = SAMPLING[case]
    with pytest.raises(TypeError, match=message):
        SamplingParams(**kwargs)


def test_sampling_params_take_integer_arrays_and_sets() -> None:
    assert SamplingParams(stop_token_ids=np.array([5, 2])).stop_token_ids == (5, 2)
    assert SamplingParams(stop_token_ids={5, 2}).stop_token_ids == (2, 5)
    assert SamplingParams(top_k=np.int64(3), seed=np.uint32(1)).top_k == 3


def test_helpers() -> None:
    assert count("n", np.int64(3)) == 3 and token_ids((1, np.int32(2)), "ids") == [1, 2]
    for bad in (2.0, True, np.bool_(True), "3", None):
        with pytest.raises(TypeError, match=r"n is .*: must be an int"):
            count("n", bad)
    with pytest.raises(TypeError, match=r"ids\[0\] is \[0, 0\] \(list\): token ids must be integers"):
        token_ids(np.zeros((2, 2), dtype=np.int64), "ids")


@pytest.mark.parametrize("ids", ["1,2.5", "1,True", "", "1,-2", "0x10"])
def test_cli_prompt_ids_are_integers(ids: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--model", "tiny-llama", "--prompt-ids", ids, "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        len(err.splitlines()) == 1 and "--prompt-ids" in err and "comma-separated list of token ids" in err
    ), err

"""RoPE's cos/sin rows in one launch (``graphrt.kernels.cos_sin``) against the torch ops.

Runs on the GPU (``-m gpu``), where the rows must be bit-equal (the same float32 operations,
CUDA's ``cosf``/``sinf`` on both sides), and on the CPU under ``TRITON_INTERPRET=1``, where the
interpreter's cos/sin come from numpy: within one unit in the last place of the dtype there.
"""

from __future__ import annotations

import pytest
import torch

from graphrt.kernels import cos_sin
from graphrt.models import ops
from graphrt.models.rope import default_inv_freq
from tests.support.triton_util import rerun_marks, rerun_under_interpreter, triton_devices

#: One unit in the last place, relative.
ULP = {torch.bfloat16: 2**-7, torch.float16: 2**-10, torch.float32: 2**-23}


@pytest.fixture
def kernel_on(monkeypatch: pytest.MonkeyPatch, device: torch.device) -> None:
    if device.type == "cpu":
        monkeypatch.setenv(cos_sin.ENV, "interpret")


def _positions(tokens: int, device: torch.device, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 131072, (tokens,), generator=gen).to(device)


def _assert_rows(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape and got.is_contiguous()
    if got.device.type == "cuda":
        assert torch.equal(got, want)
    else:
        torch.testing.assert_close(got, want, rtol=ULP[got.dtype], atol=ULP[got.dtype])


@pytest.mark.parametrize("device", triton_devices())
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(("tokens", "rotary_dim"), [(1, 64), (7, 128), (40, 48), (300, 32)])
def test_rows_equal_the_torch_ops(
    device: torch.device, dtype: torch.dtype, tokens: int, rotary_dim: int, kernel_on: None
) -> None:
    """Any token count (several programs, a ragged last one), power-of-two and other rotary
    dims (a masked head), positions up to 128k, every output dtype."""
    positions = _positions(tokens, device, seed=tokens)
    inv_freq = default_inv_freq(500000.0, rotary_dim).to(device)
    assert cos_sin.takes(positions, inv_freq, dtype)
    got = ops.rope_cos_sin(positions, inv_freq, dtype)
    _assert_rows(got, ops.rope_cos_sin_ref(positions, inv_freq, dtype))
    empty = ops.rope_cos_sin(positions[:0], inv_freq, dtype)
    assert empty.shape == (0, rotary_dim)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
def test_graph_replays_new_positions() -> None:
    """Captured once (with PDL), replayed after the positions are rewritten in place."""
    device = torch.device("cuda")
    positions = _positions(16, device, seed=0)
    inv_freq = default_inv_freq(10000.0, 64).to(device)
    stream = torch.cuda.Stream(device)
    with torch.cuda.stream(stream):
        ops.rope_cos_sin(positions, inv_freq, torch.bfloat16)
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = ops.rope_cos_sin(positions, inv_freq, torch.bfloat16)
    for seed in range(1, 4):
        positions.copy_(_positions(16, device, seed))
        graph.replay()
        torch.cuda.synchronize(device)
        assert torch.equal(out, ops.rope_cos_sin_ref(positions, inv_freq, torch.bfloat16)), seed


def test_when_the_kernel_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    inv_freq = default_inv_freq(10000.0, 64)
    monkeypatch.setenv(cos_sin.ENV, "0")
    assert not cos_sin.takes(torch.zeros(4, dtype=torch.int64), inv_freq, torch.bfloat16)
    monkeypatch.delenv(cos_sin.ENV)
    assert not cos_sin.takes(torch.zeros(4, dtype=torch.int64, device=cpu), inv_freq, torch.bfloat16)
    if cos_sin.triton is not None and torch.cuda.is_available():
        on = inv_freq.to(cuda)
        assert cos_sin.takes(torch.zeros(4, dtype=torch.int32, device=cuda), on, torch.float16)
        assert not cos_sin.takes(torch.zeros(4, device=cuda), on, torch.float16), "float positions"
        assert not cos_sin.takes(torch.zeros(4, dtype=torch.int64, device=cuda), on, torch.int8)
    rows = ops.rope_cos_sin(torch.arange(3), inv_freq, torch.float32)
    assert torch.equal(rows[0], torch.cat((torch.ones(32), torch.zeros(32)))), "position 0: cos 1, sin 0"


@rerun_marks
def test_kernel_under_triton_interpreter() -> None:
    """On a CPU box: this file again, with the kernel run by Triton's interpreter."""
    rerun_under_interpreter(__file__, passed=13)

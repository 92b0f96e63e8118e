"""FP8 weights: per-row e4m3 quantization, the FP8 skinny GEMM against its torch reference, and
a model quantized at build time (graph = eager, close to its bf16/fp32 self, bad names refused).

The kernel runs on the GPU (``-m gpu``) and on the CPU under ``TRITON_INTERPRET=1``. The
reference sums fp32 products of the same values (every e4m3 weight and 16-bit activation
product is exact in fp32) and scales once per output: the kernel may differ only where another
summation order crosses a rounding boundary of the output dtype (one unit in the last place).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrt import Batch, ForwardMode
from graphrt.engine.stack import build_stack
from graphrt.kernels import fp8_gemm as f8
from graphrt.models import ops
from graphrt.models.quantize import quantizable, quantize
from graphrt.step.config import RuntimeConfig
from tests.support.triton_util import triton_devices

ULP = {torch.bfloat16: 2**-7, torch.float16: 2**-10, torch.float32: 1e-6}


def _weights(n: int, k: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * k**-0.5


def test_quantize_maps_each_rows_largest_magnitude_to_448() -> None:
    w = _weights(24, 40)
    w[3] = 0.0  # NOTE: an all-zero row keeps a finite scale
    q, scale = f8.quantize(w)
    assert q.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32 and scale.shape == (24,)
    peaks = q.float().abs().amax(dim=1)
    assert torch.all(peaks[torch.arange(24) != 3] == f8.FP8_MAX) and peaks[3] == 0
    assert torch.all(torch.isfinite(scale)) and scale[3] == f8.MIN_SCALE
    # NOTE: e4m3 keeps 3 mantissa bits: half a step is 2**-4 of a value, relative
    err = (f8.dequantize(q, scale) - w).abs()
    assert torch.all(err <= w.abs() * 2**-4 + scale[:, None] * 2**-9)


def test_reference_is_the_dequantized_product_in_float32() -> None:
    w, x, b = _weights(16, 32), torch.randn(5, 32, dtype=torch.float64).float(), torch.randn(16)
    q, scale = f8.quantize(w)
    want = x.double() @ f8.dequantize(q, scale).double().T + b.double()
    torch.testing.assert_close(f8.fp8_linear_ref(x, q, scale, b).double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", triton_devices())
@pytest.mark.parametrize("m", [1, 3, 16])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kernel_matches_reference(device: torch.device, m: int, dtype: torch.dtype, monkeypatch) -> None:
    if device.type == "cpu":
        monkeypatch.setenv("GRAPHRT_SKINNY_GEMM", "interpret")
    w = _weights(48, 64, seed=m).to(device)
    q, scale = f8.quantize(w)
    x = torch.randn(m, 64, generator=torch.Generator().manual_seed(m)).to(device, dtype)
    b = torch.randn(48, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    assert f8.problem(x, q, scale, b) is None
    got, want = f8.fp8_linear(x, q, scale, b), f8.fp8_linear_ref(x, q, scale, b)
    assert got.dtype == dtype and got.shape == (m, 48)
    torch.testing.assert_close(got.float(), want.float(), rtol=ULP[dtype], atol=1e-5)


def test_problem_names_the_value_and_the_limit() -> None:
    q, scale = f8.quantize(_weights(8, 16))
    assert "1..64" in f8.problem(torch.randn(65, 16), q, scale, None)
    assert "want" in f8.problem(torch.randn(1, 16), q, scale[:4], None)
    # NOTE: more rows than the kernel takes still compute, through the reference
    torch.testing.assert_close(ops.linear(torch.randn(65, 16), q, None, scale).shape, (65, 8))


def _decode(stack, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill one request of ``context`` tokens, then one DECODE step graphed and one eager."""
    ids = np.arange(1, context + 1) % 500
    prompt = Batch.create(
        ForwardMode.EXTEND, input_ids=ids, seq_lens=[context], req_pool_indices=[0],
        out_cache_loc=np.arange(context), q_lens=[context],
    )  # fmt: skip
    stack.runtime.run(prompt)
    step = Batch.create(
        ForwardMode.DECODE,
        input_ids=[7],
        seq_lens=[context + 1],
        req_pool_indices=[0],
        out_cache_loc=[context],
    )
    return stack.runtime.run(step).clone(), stack.runtime.run(step, eager=True).clone()


def test_a_quantized_model_replays_like_eager_and_stays_close() -> None:
    config = RuntimeConfig(max_batch_size=2, max_context_len=64, page_size=16)
    cpu = torch.device("cpu")
    plain = build_stack("tiny-llama", cpu, config)
    fp8 = build_stack("tiny-llama", cpu, config, quantization="fp8")
    layers = quantizable(fp8.model)
    assert len(layers) == 4 * 4 and all(m.weight.dtype == torch.float8_e4m3fn for m in layers)
    assert fp8.model.lm_head.weight.dtype == torch.float32  # NOTE: the head keeps the model's dtype
    plain.runtime.capture()
    fp8.runtime.capture()
    base, _ = _decode(plain, 9)
    graphed, eager = _decode(fp8, 9)
    assert torch.equal(graphed, eager)
    rel = (graphed - base).norm() / base.norm()
    assert 0 < rel < 0.1, rel


def test_unknown_schemes_and_models_without_projections_are_refused() -> None:
    config = RuntimeConfig(max_batch_size=1, max_context_len=32, page_size=16)
    with pytest.raises(ValueError, match="quantization 'int4' is not supported; supported: fp8"):
        build_stack("tiny-llama", torch.device("cpu"), config, quantization="int4")
    with pytest.raises(ValueError, match="encoder-decoder"):
        build_stack("tiny-cross", torch.device("cpu"), config, quantization="fp8")
    with pytest.raises(ValueError, match="has no layer it quantizes"):
        quantize(torch.nn.Linear(4, 4), "fp8")

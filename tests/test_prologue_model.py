"""The fused prologues inside the model (``Block``, ``MLP``, the head): a single-row step fused
against the same step with ``GRAPHRT_FUSED_PROLOGUE=0`` (the unfused ops, the oracle).

CPU: Triton's interpreter runs the kernels (``GRAPHRT_SKINNY_GEMM=GRAPHRT_FUSED_PROLOGUE=interpret``)
in eager steps: the emulated capture engine records aten ops and a Triton launch is none, so the
graph path with the fused kernels is checked on the GPU (``-m gpu``), on SmolLM2's shapes: fused
vs unfused logits, the captured graphs' kernel counts, and replay == eager bit for bit.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from graphrt import ForwardMode
from graphrt.models import ops
from graphrt.models import prologue as pr
from graphrt.models import skinny as sk
from tests.triton_util import rerun_marks, rerun_under_interpreter, triton_devices
from tests.util import Setup, backends, build_runtime, decode_batch, prefill

#: Largest relative difference between two bf16 paths through the same random model, in L2 norm
#: and in max |difference| / max |logit|. Measured on the CPU (interpreter, unfused = the same
#: step with the torch ops): tiny-llama (4 layers) 1.4 % and 1.8 %, smollm2-shape (30 layers)
#: 1.9 % and 1.6 %, as between the plain skinny GEMM and torch (1.8 %, 1.5 %).
TOLERANCE = 2**-4


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    """Fused and unfused logits agree to bf16 rounding: the activations round at the same places
    but land one ulp apart now and then (the fp32 ``rsqrt``, ``silu``; on the GPU sgl-kernel's
    add + norm may normalise the unrounded sum), and every layer carries that on."""
    got, want = got.float(), want.float()
    l2 = ((got - want).norm() / want.norm()).item()
    peak = ((got - want).abs().max() / want.abs().max()).item()
    assert max(l2, peak) <= TOLERANCE, f"fused vs unfused logits: relative L2 {l2:.3g}, max {peak:.3g}"


@pytest.fixture
def kernels_on(monkeypatch: pytest.MonkeyPatch, device: torch.device) -> str:
    """The switches' "on" value here (the interpreter on the CPU); returns it."""
    on = "interpret" if device.type == "cpu" else "1"
    monkeypatch.setenv(sk.ENV, on)
    monkeypatch.setenv(pr.ENV, on)
    return on


def spy(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """Count the fused launches by kernel entry point."""
    calls: Counter = Counter()
    for name in ("norm_linear", "silu_mul_linear"):
        kernel = getattr(pr, name)
        monkeypatch.setattr(pr, name, lambda *a, _k=kernel, _n=name, **kw: calls.update([_n]) or _k(*a, **kw))
    return calls


def runtime(device: torch.device, model: str, capture: bool, backend: str = "reference") -> Setup:
    setup = build_runtime(
        device, model=model, backend=backend, max_batch_size=2, max_context_len=64, capture=capture,
        dtype=torch.bfloat16,
    )  # fmt: skip
    prefill(setup, [0, 1], [20, 33], np.random.default_rng(0))  # NOTE: 53 rows: unfused
    return setup


@pytest.mark.parametrize("device", triton_devices())
def test_single_row_step_fuses_every_norm_and_activation(device, kernels_on, monkeypatch) -> None:
    """``2 L + 1`` fused norms (qkv and gate_up of every layer, the head) and ``L`` fused
    SiLU-and-mul for one row; none for two rows or with the switch at 0."""
    monkeypatch.setattr(sk, "TILES", ((64, 1 << 62, sk.Tile(32, 256)),))  # NOTE: few programs to interpret
    setup = runtime(device, "tiny-llama", capture=False)
    layers = setup.model.cfg.num_layers
    calls = spy(monkeypatch)
    rng = np.random.default_rng(1)
    one = decode_batch(setup, [1], [34], rng)
    fused = setup.runtime.run(one, eager=True)
    assert calls == Counter(norm_linear=2 * layers + 1, silu_mul_linear=layers)
    monkeypatch.setenv(pr.ENV, "0")
    unfused = setup.runtime.run(one, eager=True)
    close(fused, unfused)
    monkeypatch.setenv(pr.ENV, kernels_on)
    setup.runtime.run(decode_batch(setup, [0, 1], [21, 34], rng), eager=True)
    assert sum(calls.values()) == 3 * layers + 1, "two rows take the unfused ops"


def kernel_counts(setup: Setup) -> tuple[int, int]:
    """``(all kernels, fused-prologue kernels)`` of the bucket-1 DECODE graph."""
    info = setup.runtime.dispatcher.graphs[(ForwardMode.DECODE, 1)].info
    fused = sum(k.count for k in info.kernels if "prologue_gemm" in k.name)
    return sum(k.count for k in info.kernels), fused


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
@pytest.mark.parametrize("backend", backends(torch.device("cuda")) if torch.cuda.is_available() else [])
def test_smollm2_shape_graph_is_fused_and_exact(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """SmolLM2's shapes: the graph holds ``3 L + 1`` fewer kernels, replays what eager computes bit
    for bit, and its logits equal the unfused graph's to bf16 rounding."""
    device = torch.device("cuda")
    monkeypatch.setenv(pr.ENV, "1")
    fused = runtime(device, "smollm2-shape", capture=True, backend=backend)
    monkeypatch.setenv(pr.ENV, "0")
    plain = runtime(device, "smollm2-shape", capture=True, backend=backend)
    layers = fused.model.cfg.num_layers
    (total, prologues), (plain_total, plain_prologues) = kernel_counts(fused), kernel_counts(plain)
    assert (prologues, plain_prologues) == (3 * layers + 1, 0)
    removed = plain_total - total
    print(f"{backend}: DECODE bs 1 graph {plain_total} -> {total} kernels")
    # NOTE: exactly the norms and silu_and_mul with sgl-kernel; more where torch ops stand in.
    assert removed == 3 * layers + 1 if ops._sgl() is not None else removed > 3 * layers
    rng = np.random.default_rng(2)
    for seq_len in (21, 22, 23):  # NOTE: one past what row 0 holds, each step
        batch = decode_batch(fused, [0], [seq_len], rng)
        monkeypatch.setenv(pr.ENV, "1")
        eager = fused.runtime.run(batch, eager=True)
        graph = fused.runtime.run(batch)
        assert torch.equal(graph, eager), f"seq_len {seq_len}: replay differs from eager"
        unfused = plain.runtime.run(batch)
        print(f"seq_len {seq_len}: max |fused - unfused| {(graph - unfused).abs().max().item():.3g}")
        close(graph, unfused)


@rerun_marks
def test_model_under_triton_interpreter() -> None:
    """On a CPU box: this file again, with the kernels run by Triton's interpreter."""
    rerun_under_interpreter(__file__, passed=1)

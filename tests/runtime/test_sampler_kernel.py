"""The fused sampler (``graphrt.runtime.sampler.kernel``) against the torch sampler, token for token.

Runs on the GPU (``-m gpu``: real vocabularies, graphs) and on the CPU under ``TRITON_INTERPRET=1``
(chunks of 128 entries there, so that a few hundred tokens make several chunks). Both sides
compute every integer step exactly and every float32 step with the same IEEE operations; only
``exp``/``log`` come from different libraries, and no logits here bring two scores within their
last bit of each other, so the tokens must be equal.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrt import SamplingParams
from graphrt.kernels.tuning import SamplerRule
from graphrt.metadata.sampling import SamplingBuffers, sampling_inputs
from graphrt.runtime.sampler import launch
from graphrt.runtime.sampler.draw import ENV, fused_sampler, sample, sample_torch
from tests.support.triton_util import (
    INTERPRET,
    NO_SPILLS,
    ptxas_report,
    rerun_marks,
    rerun_under_interpreter,
    sm90_ptx,
    triton_devices,
)
from tests.support.tuning_util import patch_tuning

#: One row per case: greedy, plain, each filter alone and together, hot and cold.
PARAMS = (
    SamplingParams(),
    SamplingParams(temperature=1.0, seed=1),
    SamplingParams(temperature=0.7, top_k=5, seed=2),
    SamplingParams(temperature=1.0, top_p=0.9, seed=3),
    SamplingParams(temperature=1.0, top_k=1, seed=4),
    SamplingParams(temperature=1.3, min_p=0.1, seed=5),
    SamplingParams(temperature=1.0, top_k=50, top_p=0.9, min_p=0.05, seed=6),
    SamplingParams(temperature=2.0, top_p=0.5, seed=7),
    SamplingParams(temperature=0.5, top_k=400, seed=8),
    SamplingParams(temperature=3.0, top_p=0.999, seed=2**62 + 9),
    SamplingParams(temperature=0.05, top_p=0.95, seed=10),
    SamplingParams(temperature=1.0, top_k=40, top_p=0.95, seed=11),
)
KINDS = ("normal", "ties", "flat", "masked", "peaked")


@pytest.fixture(autouse=True)
def _small_chunks_when_interpreted(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    device = request.node.callspec.params.get("device") if hasattr(request.node, "callspec") else None
    if device is not None and device.type == "cpu":
        monkeypatch.setenv(ENV, "interpret")
        monkeypatch.setattr(launch, "CHUNK", 128)
        patch_tuning(monkeypatch, sampler_layouts=())


def _vocab(device: torch.device) -> int:
    return 600 if device.type == "cpu" else 128256


def _logits(kind: str, rows: int, vocab: int, device: torch.device, seed: int = 0) -> torch.Tensor:
    """``[rows, vocab]``: ``normal`` (scale 3), ``ties`` (small ints: many equal logits), ``flat``
    (all equal: the most records), ``masked`` (bf16, every third token -inf), ``peaked`` (an
    LLM-like Zipf tail in random order)."""
    gen = torch.Generator().manual_seed(seed)
    if kind == "normal":
        out = torch.randn(rows, vocab, generator=gen) * 3
    elif kind == "ties":
        out = torch.randint(-2, 3, (rows, vocab), generator=gen).float()
    elif kind == "flat":
        out = torch.zeros(rows, vocab)
    elif kind == "masked":
        out = torch.randn(rows, vocab, generator=gen).bfloat16()
        out[:, 1::3] = -torch.inf
    else:
        ranks = torch.argsort(torch.rand(rows, vocab, generator=gen), dim=-1).float() + 1
        out = 12 - 1.2 * torch.log(ranks) + 0.1 * torch.randn(rows, vocab, generator=gen)
    return out.to(device)


def _params(device: torch.device, rows: int = len(PARAMS)) -> tuple[list[SamplingParams], SamplingBuffers]:
    chosen = [PARAMS[i % len(PARAMS)] for i in range(rows)]
    return chosen, sampling_inputs(chosen, np.arange(rows) * 1009 + 17, device)


@pytest.mark.parametrize("device", triton_devices())
@pytest.mark.parametrize("kind", KINDS)
def test_kernel_draws_the_torch_tokens(device: torch.device, kind: str) -> None:
    logits = _logits(kind, len(PARAMS), _vocab(device), device)
    _, params = _params(device)
    assert fused_sampler(device)
    got = sample(logits, params)
    assert got.dtype == torch.int64 and got.shape == (len(PARAMS),)
    assert torch.equal(got, sample_torch(logits, params))
    assert torch.equal(got[:1], logits[:1].float().argmax(dim=-1)), "row 0 is greedy"
    layout = launch.layout_for(_vocab(device))
    ws = launch.workspace(len(PARAMS), -(-_vocab(device) // layout.chunk), device, layout.records)
    assert not ws.arrivals.any(), "every launch leaves its arrival counters at 0"
    if (ws.state[: len(PARAMS), 0] == 1).any():  # NOTE: rows that waited for a count added to the sums
        assert not (ws.mass.any() or ws.ranks.any() or ws.totals.any()), "the row sums are 0 between launches"


def _layouts(device: torch.device) -> list[launch.Layout]:
    if device.type == "cpu":
        return [launch.Layout(256, 4, 8, 1), launch.Layout(128, 2, 4, 4, 1), launch.Layout(512, 4, 32)]
    sizes = [
        (512, 2, 8, 4, 0),
        (1024, 4, 16, 4, 0),
        (2048, 8, 16, 4, 0),
        (4096, 8, 32, 2, 0),
        (2048, 8, 8, 4, 16),
    ]
    return [launch.Layout(*size) for size in sizes]


@pytest.mark.parametrize("device", triton_devices())
@pytest.mark.parametrize("kind", ["peaked", "flat", "ties"])
def test_every_layout_draws_the_same_tokens(device: torch.device, kind: str) -> None:
    """A layout (chunk, warps, records) changes only the speed: every one draws torch's tokens,
    and the default :func:`launch.layout_for` gives is one of them."""
    logits = _logits(kind, len(PARAMS), _vocab(device), device, seed=3)
    _, params = _params(device)
    expected = sample_torch(logits, params)
    for layout in _layouts(device):
        assert torch.equal(launch.fused_sample(logits, params, layout=layout), expected), layout
    assert torch.equal(launch.fused_sample(logits, params), expected)


def test_layouts_are_checked(monkeypatch) -> None:
    with pytest.raises(ValueError, match=r"chunk 3000 is not a power of two in 128\.\.4096"):
        launch.Layout(3000, 4, 8)
    with pytest.raises(ValueError, match=r"chunk 8192 is not"):
        launch.Layout(8192, 4, 8)
    with pytest.raises(ValueError, match=r"300 records a chunk; 1\.\.255"):
        launch.Layout(1024, 4, 300)
    with pytest.raises(ValueError, match=r"tally 3 is not a power of two in 1\.\.64"):
        launch.Layout(1024, 4, 8, 3)
    with pytest.raises(ValueError, match=r"scan_warps 6 is not 0 or a power of two up to 32"):
        launch.Layout(1024, 4, 8, 2, 6)
    patch_tuning(
        monkeypatch, sampler_layouts=(SamplerRule(50000, 1024, 4, 16), SamplerRule(140000, 2048, 8, 16))
    )
    assert launch.layout_for(49152) == launch.Layout(1024, 4, 16)
    assert launch.layout_for(128256) == launch.Layout(2048, 8, 16)
    assert launch.layout_for(150000) == launch.Layout(launch.CHUNK, launch.WARPS, launch.RECORDS)


def _cut_short_case(device: torch.device, rows: int) -> tuple[torch.Tensor, SamplingBuffers]:
    """Hot rows (noise decides the scores) keeping the 8 best ranks: the rank-0 token alone in the
    last chunk (so it is that chunk's record), ranks 1..9 among 128 lesser tokens of chunk 1 (so
    the kept record there is rarely that chunk's first)."""
    chunk = launch.CHUNK
    logits = torch.zeros(rows, 4 * chunk + 1, device=device)
    logits[:, chunk : chunk + 9] = 0.9
    logits[:, -1] = 1.0
    chosen = [
        SamplingParams(temperature=5.0, top_k=8, top_p=(1.0, 0.999)[r % 2], seed=r) for r in range(rows)
    ]
    return logits, sampling_inputs(chosen, np.arange(rows), device)


@pytest.mark.parametrize("device", triton_devices())
@pytest.mark.parametrize(("records", "frontier"), [(1, 64), (32, 2)])
def test_cut_short_records_are_walked_to_the_token(
    device: torch.device, records: int, frontier: int, monkeypatch
) -> None:
    """Fewer records kept per chunk (or per row) than there are: the merge must stop where a
    chunk's records end, and the last program walks on; the tokens stay exact."""
    monkeypatch.setattr(launch, "RECORDS", records)
    monkeypatch.setattr(launch, "FRONTIER", frontier)
    rows = 24
    logits, params = _cut_short_case(device, rows)
    got = launch.fused_sample(logits, params)
    assert torch.equal(got, sample_torch(logits, params))
    ws = launch.workspace(rows, 5, device)
    known = [(0xFFFFFFFF - (ws.frontier[r, : ws.state[r, 1]] & 0xFFFFFFFF)).tolist() for r in range(rows)]
    walked = [r for r in range(rows) if got[r].item() not in known[r]]
    assert len(walked) >= rows // 4, f"rows that needed the walk: {walked}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
@pytest.mark.parametrize("vocab", [49152, 128256])
def test_graphed_batched_alone_and_torch_agree(vocab: int) -> None:
    """64 rows captured once in a CUDA graph, replayed with new logits and parameters written in
    place: the eager kernel's tokens, each row's tokens alone, and the torch sampler's."""
    device = torch.device("cuda")
    rows = 64
    logits = torch.zeros(rows, vocab, device=device, dtype=torch.bfloat16)
    chosen, params = _params(device, rows)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # NOTE: warm-up on the capture stream, as the runtime does:
        sample(logits, params)  # the capture then reuses this workspace (no memset node)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = sample(logits, params)
    for trial, kind in enumerate(KINDS):
        positions = np.arange(rows) * 7 + trial
        fresh = sampling_inputs(chosen[trial:] + chosen[:trial], positions, device)
        for name in ("temperature", "top_k", "top_p", "min_p", "seed", "position"):
            getattr(params, name).copy_(getattr(fresh, name))
        logits.copy_(_logits(kind, rows, vocab, device, seed=trial))
        graph.replay()
        eager = sample(logits, fresh)
        assert torch.equal(out, eager), kind
        assert torch.equal(eager, sample_torch(logits, fresh)), kind
        for r in (0, 3, 6, 63):
            alone = sampling_inputs([(chosen[trial:] + chosen[:trial])[r]], positions[r : r + 1], device)
            assert sample(logits[r : r + 1], alone).item() == eager[r].item(), (kind, r)


def test_switch_and_limits(monkeypatch) -> None:
    cuda = torch.device("cuda")
    monkeypatch.setenv(ENV, "0")
    assert not fused_sampler(cuda) and not fused_sampler(torch.device("cpu"))
    monkeypatch.delenv(ENV)
    assert fused_sampler(cuda) == (launch.triton is not None)
    big = torch.zeros(1, 2**21)
    params = sampling_inputs([SamplingParams(temperature=1.0, seed=1)], [0], torch.device("cpu"))
    with pytest.raises(ValueError, match=r"vocabulary of 2097152 tokens; at most 2097151"):
        sample_torch(big, params)
    with pytest.raises(ValueError, match=r"vocabulary of 2097152 tokens; at most 2097151"):
        launch.fused_sample(big, params)


@pytest.mark.parametrize("device", triton_devices())
def test_rows_whose_score_best_is_rank_0_are_done_in_scan(device: torch.device) -> None:
    """Rank 0 is always kept: a top-k / top-p row whose unfiltered draw is its rank 0 takes it
    in ``_scan`` (state DONE, no count); the others wait for ``_count``. Tokens equal torch's."""
    rows = 16
    logits = _logits("peaked", rows, _vocab(device), device, seed=5)
    chosen = [SamplingParams(temperature=(0.3, 1.5)[r % 2], top_p=0.9, seed=r) for r in range(rows)]
    params = sampling_inputs(chosen, np.arange(rows), device)
    got = launch.fused_sample(logits, params)
    assert torch.equal(got, sample_torch(logits, params))
    unfiltered = sample_torch(logits, sampling_inputs([SamplingParams(temperature=p.temperature, seed=p.seed)
                                                       for p in chosen], np.arange(rows), device))  # fmt: skip
    at_top = unfiltered == logits.float().argmax(dim=-1)
    layout = launch.layout_for(_vocab(device))
    ws = launch.workspace(rows, -(-_vocab(device) // layout.chunk), device, layout.records)
    done = ws.state[:, 0] == 0
    assert 0 < int(at_top.sum()) < rows, "both kinds of rows are present"
    assert torch.equal(done[:rows], at_top)


@pytest.mark.skipif(launch.triton is None or INTERPRET, reason="needs Triton's compiler")
@pytest.mark.parametrize("vocab", [49152, 128256])
def test_kernels_compile_for_hopper_without_spills(vocab: int) -> None:
    """Both kernels go through Triton's CUDA compiler for sm_90 at the vocabulary's layout, with
    PDL (no GPU needed: the interpreter does not type-check as the compiler does); each row's
    arrival is one acq_rel atomic, only ``_count`` waits for the kernel before it, and ptxas
    spills no register."""
    from graphrt.runtime.sampler.count import _count
    from graphrt.runtime.sampler.kernel import _scan

    layout = launch.layout_for(vocab)
    chunks = -(-vocab // layout.chunk)
    shape = {"S": chunks, "S_PAD": launch.triton.next_power_of_2(chunks), "C": layout.chunk,
             "GF": launch.FRONTIER, "ACCURATE": True, "PDL": True}  # fmt: skip
    scratch = {
        _scan: (("tops", "records", "counts", "frontier", "state"), {"PF": layout.records}),
        _count: (("frontier", "state", "mass", "ranks", "totals"), {"GB": layout.tally, "GD": launch.DECIDE}),
    }
    for fn, (names, extra) in scratch.items():
        options = {"num_warps": layout.warps, "enable_fp_fusion": False}
        ptx = _compiled(fn, names, {**shape, **extra}, options)
        assert ptx.count("atom.global.gpu.acq_rel.add") == 1, fn.__name__
        assert ("griddepcontrol.wait" in ptx) == (fn is _count), fn.__name__
        assert NO_SPILLS in ptxas_report(ptx), fn.__name__


def _compiled(fn, names: tuple[str, ...], constexprs: dict, options: dict) -> str:
    rowwise = ("temperature", "top_k", "top_p", "min_p", "seed", "position", "tokens")
    types = ("*fp32", "*i64", "*fp32", "*fp32", "*i64", "*i64", "*i64")
    signature = {"logits": "*bf16", "stride": "i32", "V": "i32", **dict(zip(rowwise, types, strict=True))}
    signature.update(
        {**dict.fromkeys(names, "*i64"), "arrivals": "*i32", **dict.fromkeys(constexprs, "constexpr")}
    )
    return sm90_ptx(fn, signature, constexprs, options)


@rerun_marks
def test_kernel_under_triton_interpreter() -> None:
    """On a CPU box: this file again, with the kernels run by Triton's interpreter."""
    rerun_under_interpreter(__file__, passed=13)

"""MoE checkpoints under tensor parallelism: each expert's intermediate dim split over the ranks.

One tiny transformers checkpoint (``save_pretrained``) per way experts shard: Qwen3-MoE
(softmax top-k, renormalised; one tensor per expert and projection), Qwen2-MoE (a sigmoid-gated
shared expert split as the dense MLP, summed with the routed experts in the layer's one
all-reduce; a dense first layer), gpt-oss (fused experts with gate and up interleaved, biases:
``b13`` split, ``b2`` added by rank 0 only; sinks, sliding layers). Each rank holds exactly its
slices of the TP=1 model's weights and reads no more than it holds; a MoE preset's seeded
shards, an MXFP4 gpt-oss's dequantized experts and each model converted to GGUF are the TP=1
weights' slices (one process, no group).
On two CPU ranks (gloo, fp32), greedy decoding of a batch of two prompts
(:mod:`tests.support.greedy_run`): logits within ``ATOL`` of TP=1 (prefill, each decode step
eager and graphed; only the all-reduce changes the summation order), greedy tokens equal TP=1's
and transformers' ``generate``. Refused at build: a TP size that does not divide
the experts' intermediate size (naming both), expert parallelism (``ep_size``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from graphrt.checkpoints import load  # noqa: E402
from graphrt.checkpoints import safetensors_dir as st_dir  # noqa: E402
from graphrt.models.llama import TinyLlama  # noqa: E402
from graphrt.models.moe import SparseMoE  # noqa: E402
from graphrt.models.presets import PRESETS  # noqa: E402
from graphrt.parallel import TPGroup  # noqa: E402
from tests.parallel.test_tp_checkpoints import torchrun  # noqa: E402
from tests.support.gguf_moe_util import write_moe_gguf  # noqa: E402
from tests.support.greedy_run import forced_rows, greedy_run, tp_forced, tp_greedy  # noqa: E402
from tests.support.hf_util import save_word_tokenizer, saved_reference  # noqa: E402
from tests.support.moe_checkpoints import MOE_CASES  # noqa: E402
from tests.support.mxfp4_checkpoint import save_mxfp4_checkpoint  # noqa: E402
from tests.support.tp_util import run_ranks  # noqa: E402

CPU = torch.device("cpu")
ATOL, ATOL_BF16 = 1e-4, 0.1  # NOTE: as tests/parallel/test_tp_checkpoints.py
CASES = ("qwen3-moe-norm-topk", "qwen2-moe-shared-gate", "gpt-oss")
PROMPTS, NEW = [[1, 2, 3], [7, 8, 9, 10, 11]], 6


@pytest.fixture(scope="module", params=CASES)
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    path = tmp_path_factory.mktemp(request.param)
    return path, saved_reference(path, *MOE_CASES[request.param])


def test_each_rank_holds_exactly_its_slices(checkpoint: tuple[Path, Any]) -> None:
    path = checkpoint[0]
    full = dict(load(path, device=CPU).named_parameters())
    for rank in range(2):
        model = load(path, device=CPU, tp=TPGroup(rank=rank, size=2))
        moe = next(layer.mlp for layer in model.layers if isinstance(layer.mlp, SparseMoE))
        e, inter, h = moe.spec.num_experts, moe.spec.expert_size, model.cfg.hidden_size
        assert moe.experts.w13.shape == (e, inter, h) and moe.experts.w2.shape == (e, h, inter // 2)
        _assert_slices(model, full, rank)


def _assert_slices(model: torch.nn.Module, full: dict[str, torch.Tensor], rank: int) -> None:
    """Every parameter of ``model`` (a TP shard) is its ``weight_loader``'s shard of the TP=1 one."""
    for name, p in model.named_parameters():
        want = full[name]
        if hasattr(p, "weight_loader"):  # NOTE: replicated parameters have none
            want = torch.full_like(p, float("nan"))
            p.weight_loader(want, full[name])
        assert torch.equal(p, want), f"rank {rank} {name}: not its slice of the TP=1 weight"


def test_mxfp4_gpt_oss_ranks_hold_their_slices(tmp_path: Path) -> None:
    """The Hub's MXFP4 gpt-oss form: experts dequantized at load, then each rank keeps its slices."""
    save_mxfp4_checkpoint(tmp_path)
    full = dict(load(tmp_path, device=CPU).named_parameters())
    for rank in range(2):
        _assert_slices(load(tmp_path, device=CPU, tp=TPGroup(rank=rank, size=2)), full, rank)


@pytest.mark.parametrize(("case", "qtype"), [("qwen3-moe-norm-topk", "Q8_0"), ("gpt-oss", "MXFP4")])
def test_gguf_ranks_hold_their_slices(tmp_path: Path, case: str, qtype: str) -> None:
    """A model converted to GGUF as llama.cpp does (experts stacked, quantized): each rank's slices
    of the dequantized weights."""
    pytest.importorskip("gguf")
    saved_reference(tmp_path / "hf", *MOE_CASES[case])
    path = write_moe_gguf(tmp_path / "hf", tmp_path / "model.gguf", qtype)
    full = dict(load(path, device=CPU).named_parameters())
    for rank in range(2):
        _assert_slices(load(path, device=CPU, tp=TPGroup(rank=rank, size=2)), full, rank)


@pytest.mark.parametrize("preset", ["tiny-qwen3-moe", "tiny-gpt-oss"])
def test_preset_shards_are_slices_of_the_tp1_weights(preset: str) -> None:
    """``Engine(preset, tp=2)``'s seeded weights: each rank draws the full tensors and keeps its slices."""
    cfg = PRESETS[preset]
    full = dict(TinyLlama.from_seed(cfg, 0, CPU, torch.float32).named_parameters())
    for rank in range(2):
        _assert_slices(
            TinyLlama.from_seed(cfg, 0, CPU, torch.float32, TPGroup(rank=rank, size=2)), full, rank
        )


def test_tp2_reads_no_more_than_it_holds(
    checkpoint: tuple[Path, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[int] = []
    real = st_dir.SafetensorsDir.read

    def spy(self: Any, name: str, device: torch.device, shard: Any) -> torch.Tensor:
        out = real(self, name, device, shard)
        reads.append(out.numel())
        return out

    monkeypatch.setattr(st_dir.SafetensorsDir, "read", spy)
    model = load(checkpoint[0], device=CPU, tp=TPGroup(rank=1, size=2))
    local = sum(p.numel() for p in model.parameters())
    assert sum(reads) <= local, (sum(reads), local)


@torch.no_grad()
def test_tp2_matches_tp1_and_transformers(checkpoint: tuple[Path, Any]) -> None:
    path, reference = checkpoint
    results = run_ranks(tp_greedy, 2, str(path), PROMPTS, NEW, deadline_s=180)
    tp1 = greedy_run(load(path, device=CPU), PROMPTS, NEW)
    for rank, run in enumerate(results):
        for got, want in zip(run.rows(), tp1.rows(), strict=True):
            diff = (got - want).abs().max().item()
            assert diff <= ATOL, f"rank {rank}: |logits - TP=1| = {diff} > {ATOL}"
        assert run.tokens == tp1.tokens, f"rank {rank}: greedy tokens differ from TP=1"
    for prompt, got in zip(PROMPTS, tp1.tokens, strict=True):
        want = reference.generate(torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False, pad_token_id=0)
        want = want[0, len(prompt) :].tolist()  # NOTE: transformers stops at EOS
        assert got[: len(want)] == want


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
def test_tp2_cuda_bf16_within_bounds(checkpoint: tuple[Path, Any]) -> None:
    """bf16 over NCCL (the fused Triton expert kernels on each rank's half of ``I``): logits of
    fixed sequences within ``ATOL_BF16`` of TP=1, or 3x TP=1's own bf16 error against fp32
    (as tests/parallel/test_tp_checkpoints.py); tokens not compared (bf16 near-ties)."""
    path = checkpoint[0]
    results = run_ranks(tp_forced, 2, str(path), "cuda", backend="nccl", timeout_s=120, deadline_s=600)
    tp1 = forced_rows(load(path, device="cuda:0"))
    fp32 = forced_rows(load(path, device="cuda:0", dtype=torch.float32))
    own = max(float(np.abs(a - b).max()) for a, b in zip(tp1, fp32, strict=True))
    bound = max(ATOL_BF16, 3 * own)
    for rank, rows in enumerate(results):
        diff = max(float(np.abs(a - b).max()) for a, b in zip(rows, tp1, strict=True))
        assert diff <= bound, f"rank {rank}: |TP2 - TP1| = {diff} > {bound} (bf16 vs fp32: {own})"


@pytest.mark.slow  # NOTE: two cold starts, ~50 s on a loaded 2-core box
def test_torchrun_generate_tp2_equals_transformers(tmp_path: Path) -> None:
    """``torchrun --nproc-per-node 2 -m graphrt generate --tp 2`` (the engine: rank 0 feeds
    the steps, graphed DECODE) prints transformers' greedy tokens once: Qwen2-MoE (shared
    expert), one group (a torchrun costs two cold starts)."""
    path = tmp_path / "qwen2-moe"
    reference = saved_reference(path, *MOE_CASES["qwen2-moe-shared-gate"])
    save_word_tokenizer(path, reference.config.vocab_size)
    argv = ["generate", "--model", str(path), "--prompt-ids", "1,2,3", "--max-new-tokens", str(NEW)]
    argv += ["--device", "cpu", "--max-context-len", "32", "--json", "--tp", "2"]
    lines = torchrun(2, *argv).stdout.strip().splitlines()
    assert len(lines) == 1, lines  # rank 0 only
    want = reference.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=NEW, do_sample=False, pad_token_id=0)
    got = json.loads(lines[0])["output_ids"]
    assert got[: want.shape[1] - 3] == want[0, 3:].tolist()


def test_tp_not_dividing_expert_size_is_refused_before_reading(
    checkpoint: tuple[Path, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = checkpoint[0]
    raw = json.loads((path / "config.json").read_text())
    key = "intermediate_size" if "GptOss" in raw["architectures"][0] else "moe_intermediate_size"
    odd = path.parent / f"{path.name}-odd"
    shutil.copytree(path, odd, dirs_exist_ok=True)
    # NOTE: 4 divides the heads (4) and replicates the 2 KV heads; 4 does not divide 30
    (odd / "config.json").write_text(json.dumps(raw | {key: 30}))
    monkeypatch.setattr(st_dir.SafetensorsDir, "read", lambda *a: pytest.fail("a tensor was read"))
    with pytest.raises(
        ValueError,
        match=r"tensor-parallel size 4 does not divide the experts. intermediate size 30$",
    ):
        load(odd, device=CPU, tp=TPGroup(rank=0, size=4))


def test_expert_parallelism_is_refused_naming_it(checkpoint: tuple[Path, Any]) -> None:
    path = checkpoint[0]
    raw = json.loads((path / "config.json").read_text())
    ep = path.parent / f"{path.name}-ep"
    shutil.copytree(path, ep, dirs_exist_ok=True)
    (ep / "config.json").write_text(json.dumps(raw | {"ep_size": 2}))
    with pytest.raises(ValueError, match=r"expert parallelism \(ep_size 2\) is not supported"):
        load(ep, device=CPU, tp=TPGroup(rank=0, size=2))

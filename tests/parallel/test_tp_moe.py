"""MoE checkpoints under tensor parallelism: each expert's intermediate dim split over the ranks.

One tiny transformers checkpoint (``save_pretrained``) per way experts shard: Qwen3-MoE
(softmax top-k, renormalised; one tensor per expert and projection), Qwen2-MoE (a sigmoid-gated
shared expert split as the dense MLP, summed with the routed experts in the layer's one
all-reduce; a dense first layer), gpt-oss (fused experts with gate and up interleaved, biases:
``b13`` split, ``b2`` added by rank 0 only; sinks, sliding layers). Each rank holds exactly its
slices of the TP=1 model's weights and reads no more than it holds (one process, no group).
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

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from graphrt.checkpoints import load  # noqa: E402
from graphrt.checkpoints import safetensors_dir as st_dir  # noqa: E402
from graphrt.models.moe import SparseMoE  # noqa: E402
from graphrt.parallel import TPGroup  # noqa: E402
from tests.support.greedy_run import greedy_run, tp_greedy  # noqa: E402
from tests.support.hf_util import saved_reference  # noqa: E402
from tests.support.moe_checkpoints import MOE_CASES  # noqa: E402
from tests.support.tp_util import run_ranks  # noqa: E402

CPU = torch.device("cpu")
ATOL = 1e-4  # NOTE: as tests/parallel/test_tp_checkpoints.py
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
        for name, p in model.named_parameters():
            want = full[name]
            if hasattr(p, "weight_loader"):  # NOTE: the shard of the TP=1 tensor, by the seeded path
                want = torch.full_like(p, float("nan"))
                p.weight_loader(want, full[name])
            assert torch.equal(p, want), f"rank {rank} {name}: not its slice of the TP=1 weight"


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

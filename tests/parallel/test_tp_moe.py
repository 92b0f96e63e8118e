"""MoE checkpoints under tensor parallelism: each expert's intermediate dim split over the ranks.

One tiny transformers checkpoint (``save_pretrained``) per way experts shard: Qwen3-MoE
(softmax top-k, renormalised; one tensor per expert and projection), Qwen2-MoE (a sigmoid-gated
shared expert split as the dense MLP, summed with the routed experts in the layer's one
all-reduce; a dense first layer), gpt-oss (fused experts with gate and up interleaved, biases:
``b13`` split, ``b2`` added by rank 0 only; sinks, sliding layers). Each rank holds exactly its
slices of the TP=1 model's weights and reads no more than it holds (one process, no group).
On two CPU ranks (gloo, fp32): logits within ``ATOL`` of TP=1 (prefill, graphed and eager
decode; only the all-reduce changes the summation order), greedy tokens of ``Engine(tp=2)``
equal TP=1's and transformers' ``generate``. Refused at build: a TP size that does not divide
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

from graphrt import Engine  # noqa: E402
from graphrt.checkpoints import load  # noqa: E402
from graphrt.checkpoints import safetensors_dir as st_dir  # noqa: E402
from graphrt.models.moe import SparseMoE  # noqa: E402
from graphrt.parallel import TPGroup, init_tp  # noqa: E402
from tests.support.hf_util import ParityRun, run_graphrt, saved_reference, sequences  # noqa: E402
from tests.support.moe_checkpoints import MOE_CASES  # noqa: E402
from tests.support.tp_util import run_ranks  # noqa: E402

CPU = torch.device("cpu")
ATOL = 1e-4  # NOTE: as tests/parallel/test_tp_checkpoints.py
CASES = ("qwen3-moe-norm-topk", "qwen2-moe-shared-gate", "gpt-oss")
PROMPTS, NEW = [[1, 2, 3], [7, 8, 9, 10, 11]], 6
ENGINE = dict(device="cpu", max_batch_size=2, max_context_len=32, buckets=(2,))


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


def _rows(run: ParityRun) -> list[torch.Tensor]:
    return [*run.prefill, *run.decode_graph, *run.decode_eager]


def moe_parity(rank: int, world: int, path: str) -> tuple[list[np.ndarray], list[list[int]]]:
    """This rank's logits rows (prefill, graphed and eager decode) and rank 0's engine tokens at TP=world.

    NOTE: numpy, not tensors: a tensor crosses the queue in shared memory its exiting rank frees.
    """
    group = init_tp(world, CPU)
    model = load(path, device=group.device, tp=group)
    rows = [r.numpy() for r in _rows(run_graphrt(model, sequences(model.vocab_size)))]
    engine = Engine(path, tp=world, **ENGINE)
    tokens = engine.generate(PROMPTS if rank == 0 else [[5]], NEW)
    engine.close()
    return rows, tokens


@torch.no_grad()
def test_tp2_matches_tp1_and_transformers(checkpoint: tuple[Path, Any]) -> None:
    path, reference = checkpoint
    results = run_ranks(moe_parity, 2, str(path), deadline_s=180)
    tp1 = _rows(run_graphrt(load(path, device=CPU), sequences(reference.config.vocab_size)))
    for rank, (rows, _) in enumerate(results):
        for got, want in zip(map(torch.from_numpy, rows), tp1, strict=True):
            diff = (got - want).abs().max().item()
            assert diff <= ATOL, f"rank {rank}: |logits - TP=1| = {diff} > {ATOL}"
            assert torch.equal(got.argmax(-1), want.argmax(-1)), f"rank {rank}: a greedy token differs"
    tokens = results[0][1]
    assert tokens == Engine(str(path), **ENGINE).generate(PROMPTS, NEW)
    for prompt, got in zip(PROMPTS, tokens, strict=True):
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

"""MoE checkpoints saved by transformers == the transformers forward, every family.

Prefill and decode logits (eager and graphed with the emulated engine) against transformers'
forward, greedy tokens against its ``generate``, and a batch of prompts against each prompt
alone. Families: Mixtral, Qwen2-MoE (gated shared expert, a dense layer), Qwen3-MoE, OLMoE (q/k
norms over the whole projection), DeepSeek-V2 (group-limited greedy, shared experts held as
extra experts, a dense layer) and V3 (sigmoid scores with the correction bias, grouped top-k;
and with DeepSeek's YaRN: the softmax scale times ``mscale ** 2``), gpt-oss (sinks, sliding
layers, YaRN, interleaved fused experts with biases, clamped SwiGLU). Tolerances as
tests/models/test_models_hf.py: fp32 CPU 1e-4; bf16 CUDA three times transformers' own bf16 error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from graphrt.checkpoints import load  # noqa: E402
from graphrt.models.moe import SparseMoE  # noqa: E402
from tests.support.hf_util import check_checkpoint, check_greedy_generate, saved_reference  # noqa: E402
from tests.support.moe_checkpoints import MOE_CASES  # noqa: E402


@pytest.fixture(scope="module", params=list(MOE_CASES))
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    path = tmp_path_factory.mktemp(request.param)
    return path, saved_reference(path, *MOE_CASES[request.param])


def test_checkpoint_matches_transformers(device: torch.device, checkpoint: tuple[Path, Any]) -> None:
    model = load(checkpoint[0], device="cpu")
    sparse = [isinstance(layer.mlp, SparseMoE) for layer in model.layers]
    assert any(sparse), "no MoE layer was built"
    if "Deepseek" in model.cfg.architecture:  # NOTE: its shared experts run in the expert kernels
        for moe in (layer.mlp for layer in model.layers if isinstance(layer.mlp, SparseMoE)):
            assert moe.shared is None and moe.spec.shared_slots > 0
            assert moe.experts.w13.shape[0] == moe.spec.num_experts + moe.spec.shared_slots
    # NOTE: fp32 on the GPU too: in bf16 a routing near-tie picks other experts in any two
    # implementations (transformers' bf16 misses its own fp32 that way), so the bound of
    # "three times transformers' bf16 error" cannot hold token by token for MoE layers.
    check_checkpoint(device, *checkpoint, dtype=torch.float32)


@torch.no_grad()
def test_greedy_tokens_equal_transformers_generate(checkpoint: tuple[Path, Any]) -> None:
    """``Engine(dir)`` (graphed DECODE, fp32 CPU) == transformers' greedy ``generate``; the batch
    gives each prompt the tokens it gets alone."""
    check_greedy_generate(*checkpoint)

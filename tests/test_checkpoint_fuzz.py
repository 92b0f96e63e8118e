"""Issue 24.5 and 24.6: 200 randomly damaged copies of each checkpoint kind and of a snapshot.

Each copy either loads (a flipped weight byte is still a checkpoint) or raises the documented
error naming the file: :class:`CheckpointError` for a GGUF, a safetensors directory (weights,
``config.json``) and a tokenizer, :class:`SnapshotError` for a snapshot. Nothing else: no
``IndexError``, ``SafetensorError``, ``JSONDecodeError``, ``RecursionError`` or hang. The RNG
is seeded, the files small.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")

from graphrt.debug.snapshot import SnapshotError, load_snapshot, npz_path  # noqa: E402
from graphrt.models import CheckpointError, load  # noqa: E402
from graphrt.models.tokenizer import load_tokenizer  # noqa: E402
from tests.gguf_util import write_gguf  # noqa: E402
from tests.hf_util import SMALL, randomize, save_checkpoint, save_word_tokenizer  # noqa: E402
from tests.snapshots import take  # noqa: E402

COPIES = 200
HUGE = (2**32, 2**40, 2**63, 2**64 - 1)


def config() -> object:
    return transformers.LlamaConfig(**SMALL, num_attention_heads=4, num_key_value_heads=2)


def damaged(blob: bytes, header: int, rng: np.random.Generator) -> bytes:
    """``blob`` cut short, flipped, given an absurd 8-byte count, zeroed or overwritten; most
    damage lands in the first ``header`` bytes (the part a reader trusts)."""
    b, op = bytearray(blob), int(rng.integers(0, 6))
    at = int(rng.integers(0, max(min(header, len(b)) - 8, 1)))
    if op == 0:
        return bytes(b[: int(rng.integers(0, len(b)))])
    if op in (1, 2):
        span = min(header, len(b)) if op == 1 else len(b)
        for i in rng.integers(0, span, int(rng.integers(1, 9))):
            b[int(i)] ^= int(rng.integers(1, 256))
    elif op == 3:
        b[at : at + 8] = HUGE[int(rng.integers(0, len(HUGE)))].to_bytes(8, "little")
    elif op == 4:
        end = at + int(rng.integers(1, 64))
        b[at:end] = bytes(len(b[at:end]))
    else:
        b[at:] = rng.bytes(int(rng.integers(0, 64))) + bytes(b[at + int(rng.integers(0, 64)) :])
    return bytes(b)


def damaged_json(text: str, rng: np.random.Generator) -> str:
    """Text damage: cut short, a value swapped for an impossible one, deep nesting, garbage."""
    op = int(rng.integers(0, 4))
    if op == 0:
        return text[: int(rng.integers(0, len(text)))]
    if op == 1:
        data = json.loads(text)
        key = str(rng.choice(sorted(data)))
        data[key] = [0, -1, 2**40, "x", 1.5, None, True, [], {"a": 1}][int(rng.integers(0, 9))]
        return json.dumps(data)
    if op == 2:
        depth = int(rng.choice([50, 5000, 100000]))
        return text[:-1] + ', "deep": ' + "[" * depth + "]" * depth + "}"
    at = int(rng.integers(0, len(text)))
    return text[:at] + rng.bytes(int(rng.integers(1, 16))).decode("latin-1") + text[at + 1 :]


def outcomes(copies: int, make: Callable[[int, np.random.Generator], Path], read: Callable[[Path], object],
             error: type[Exception], seed: int) -> dict[str, int]:  # fmt: skip
    """Read ``copies`` damaged copies; each loads or raises ``error`` naming its file."""
    rng, seen = np.random.default_rng(seed), {"loaded": 0, "refused": 0}
    for i in range(copies):
        path = make(i, rng)
        try:
            read(path)
        except error as err:
            assert str(path) in str(err), f"copy {i}: the message does not name {path}: {err}"
            seen["refused"] += 1
        except BaseException as err:  # NOTE: anything else is the bug this test hunts
            raise AssertionError(f"copy {i} of {path.name}: {type(err).__name__}: {err}") from err
        else:
            seen["loaded"] += 1
    return seen


@pytest.fixture(scope="module")
def originals(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("originals")
    model = transformers.LlamaForCausalLM(config()).eval()
    randomize(model, seed=0)
    gguf = write_gguf(root / "m.gguf", model, "llama", "Q8_0")
    hf = root / "hf"
    save_checkpoint(hf, transformers.LlamaForCausalLM, config())
    save_word_tokenizer(hf, SMALL["vocab_size"])
    return {"gguf": gguf, "hf": hf, "snapshot": take(root)[2]}


def gguf_header_bytes(path: Path) -> int:
    from gguf import GGUFReader

    return int(GGUFReader(str(path)).data_offset)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # NOTE: NaN scales
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
        shutil.copy(originals["hf"] / "config.json", path)
        if rng.random() < 0.5:
            (path / "model.safetensors").write_bytes(damaged(weights, header, rng))
        else:
            (path / "model.safetensors").write_bytes(weights)
            (path / "config.json").write_text(damaged_json(text, rng))
        return path

    seen = outcomes(COPIES, make, lambda p: load(p, device="cpu"), CheckpointError, seed=2)
    assert seen["refused"] > COPIES // 2, seen


def test_damaged_tokenizer(originals: dict[str, Path], tmp_path: Path) -> None:
    """A ``tokenizer.json`` cut short or garbled cannot be built: CheckpointError, the dir named."""
    text = (originals["hf"] / "tokenizer.json").read_text()

    def make(i: int, rng: np.random.Generator) -> Path:
        path = tmp_path / f"tok{i}"
        shutil.copytree(originals["hf"], path)
        (path / "tokenizer.json").write_text(
            damaged_json(text, rng) if i % 2 else text[: len(text) // (i + 2)]
        )
        return path

    seen = outcomes(12, make, load_tokenizer, CheckpointError, seed=3)
    assert seen["refused"] >= 6, seen


def test_damaged_snapshot(originals: dict[str, Path], tmp_path: Path) -> None:
    text = originals["snapshot"].read_text()
    arrays = npz_path(originals["snapshot"]).read_bytes()

    def make(i: int, rng: np.random.Generator) -> Path:
        path = tmp_path / f"snap{i}.json"
        if rng.random() < 0.7:
            path.write_text(damaged_json(text, rng))
            npz_path(path).write_bytes(arrays)
        else:
            path.write_text(text)
            npz_path(path).write_bytes(damaged(arrays, 512, rng))
        return path

    def read(path: Path) -> object:
        try:
            return load_snapshot(path)
        except SnapshotError as err:  # NOTE: the .npz's message names the .npz beside the JSON
            raise SnapshotError(str(err).replace(str(npz_path(path)), f"{path} (.npz)")) from err

    seen = outcomes(COPIES, make, read, SnapshotError, seed=4)
    assert seen["refused"] > COPIES // 2, seen

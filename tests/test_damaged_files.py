"""Issue 24.5 and 24.6, case by case: each damaged file of the issue, through the API and the CLI.

The API raises :class:`CheckpointError` (a ``ValueError``) or :class:`SnapshotError` naming the
file and the fault; ``graphrt generate`` / ``graphrt inspect`` print that one line, no
traceback, and exit 2.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")

from graphrt.cli import main  # noqa: E402
from graphrt.debug.snapshot import SnapshotError, load_snapshot  # noqa: E402
from graphrt.models import CheckpointError, load  # noqa: E402
from tests.gguf_util import write_gguf  # noqa: E402
from tests.hf_util import SMALL, randomize, save_checkpoint, save_word_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("good")
    config = transformers.LlamaConfig(**SMALL, num_attention_heads=4, num_key_value_heads=2)
    model = transformers.LlamaForCausalLM(config).eval()
    randomize(model, seed=0)
    hf = root / "hf"
    save_checkpoint(hf, transformers.LlamaForCausalLM, config)
    save_word_tokenizer(hf, SMALL["vocab_size"])
    return {"gguf": write_gguf(root / "m.gguf", model, "llama", "F32"), "hf": hf}


def gguf_edit(edit: Callable[[bytes], bytes]) -> Callable[[dict[str, Path], Path], Path]:
    def make(good: dict[str, Path], tmp: Path) -> Path:
        path = tmp / "damaged.gguf"
        path.write_bytes(edit(good["gguf"].read_bytes()))
        return path

    return make


def hf_edit(name: str, edit: Callable[[bytes], bytes]) -> Callable[[dict[str, Path], Path], Path]:
    def make(good: dict[str, Path], tmp: Path) -> Path:
        path = tmp / "damaged"
        shutil.copytree(good["hf"], path)
        (path / name).write_bytes(edit((path / name).read_bytes()))
        return path

    return make


def heads(value: object) -> Callable[[bytes], bytes]:
    def edit(raw: bytes) -> bytes:
        return json.dumps(json.loads(raw) | {"num_attention_heads": value}).encode()

    return edit


CASES = {
    "gguf cut in the header": (
        gguf_edit(lambda b: b[:300]),
        r"damaged\.gguf: not a readable GGUF file: .*cut short",
    ),
    "gguf cut in the data": (
        gguf_edit(lambda b: b[: len(b) - 100]),
        r"damaged\.gguf: .*runs past the end of the file",
    ),
    "gguf 2**40 tensors": (
        gguf_edit(lambda b: b[:8] + (2**40).to_bytes(8, "little") + b[16:]),
        r"damaged\.gguf: .*the header claims 1099511627776 tensors, more than a file of \d+ bytes can hold",
    ),
    "safetensors cut short": (
        hf_edit("model.safetensors", lambda b: b[: len(b) // 2]),
        r"model\.safetensors: not a readable safetensors file: .*incomplete metadata",
    ),
    "config.json cut short": (
        hf_edit("config.json", lambda b: b[: len(b) // 2]),
        r"config\.json: not valid JSON",
    ),
    "zero heads": (
        hf_edit("config.json", heads(0)),
        r"config\.json: config num_attention_heads = 0: must be >= 1",
    ),
    "heads not dividing": (
        hf_edit("config.json", heads(3)),
        r"num_key_value_heads = 2 does not divide .* = 3",
    ),
    "float heads": (hf_edit("config.json", heads(4.0)), r"num_attention_heads must be an integer, got 4\.0"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_damaged_checkpoint_is_named(good: dict[str, Path], tmp_path: Path, case: str) -> None:
    make, message = CASES[case]
    with pytest.raises(CheckpointError, match=message):
        load(make(good, tmp_path), device="cpu")


@pytest.mark.parametrize(
    "case", ["gguf cut in the header", "gguf 2**40 tensors", "safetensors cut short", "zero heads"]
)
def test_cli_prints_one_line(
    good: dict[str, Path], tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    make, message = CASES[case]
    argv = ["generate", "--model", str(make(good, tmp_path)), "--prompt-ids", "1,2", "--device", "cpu"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("graphrt generate: error: ") and str(tmp_path) in err, err
    assert re.search(message, err), err


def test_tokenizer_that_cannot_be_built(
    good: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = hf_edit("tokenizer.json", lambda b: b[:40])(good, tmp_path)
    assert main(["generate", "--model", str(path), "--prompt", "t1 t2", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{path}: cannot build the tokenizer" in err, err


def test_deeply_nested_snapshot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "deep.json"
    path.write_text('{"version": 1, "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(SnapshotError, match=r"deep\.json: JSON nested too deeply"):
        load_snapshot(path)
    assert main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nested too deeply" in err, err


def test_oversized_snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from graphrt.debug import reader

    monkeypatch.setattr(reader, "MAX_JSON_BYTES", 1000)
    path = tmp_path / "big.json"
    path.write_text(json.dumps({"version": 1, "pad": "x" * 2000}))
    with pytest.raises(SnapshotError, match=r"big\.json: \d+ bytes is larger than a snapshot's facts can be"):
        load_snapshot(path)

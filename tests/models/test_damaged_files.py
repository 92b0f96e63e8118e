"""Issue 24.5, case by case: each damaged checkpoint of the issue, through the API and the CLI.

The API raises :class:`CheckpointError` (a ``ValueError``) naming the file and the fault;
``graphrt generate`` prints that one line, no traceback, and exits 2. Config checks cover the
Llama-family keys and DeepSeek-V2/V3's MLA keys.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")

from graphrt.checkpoints import CheckpointError, load  # noqa: E402
from graphrt.cli import main  # noqa: E402
from graphrt.text.tokenizer import load_tokenizer  # noqa: E402
from tests.models.test_checkpoint_fuzz import TINY  # noqa: E402
from tests.support.gguf_util import write_gguf  # noqa: E402
from tests.support.hf_util import randomize, save_checkpoint, save_word_tokenizer  # noqa: E402

Make = Callable[[dict[str, Path], Path], Path]


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("good")
    config = transformers.LlamaConfig(**TINY)
    model = transformers.LlamaForCausalLM(config).eval()
    randomize(model, seed=0)
    hf = root / "hf"
    save_checkpoint(hf, transformers.LlamaForCausalLM, config)
    save_word_tokenizer(hf, TINY["vocab_size"])
    mla = root / "mla"
    mla_config = transformers.DeepseekV3Config(
        **TINY | {"num_key_value_heads": 2},
        q_lora_rank=None,
        kv_lora_rank=32,
        qk_rope_head_dim=16,
        qk_nope_head_dim=16,
        v_head_dim=16,
        first_k_dense_replace=1,
    )
    save_checkpoint(mla, transformers.DeepseekV3ForCausalLM, mla_config)
    return {"gguf": write_gguf(root / "m.gguf", model, "llama", "F32"), "hf": hf, "mla": mla}


def gguf_edit(edit: Callable[[bytes], bytes]) -> Make:
    def make(good: dict[str, Path], tmp: Path) -> Path:
        path = tmp / "damaged.gguf"
        path.write_bytes(edit(good["gguf"].read_bytes()))
        return path

    return make


def dir_edit(kind: str, name: str, edit: Callable[[bytes], bytes]) -> Make:
    def make(good: dict[str, Path], tmp: Path) -> Path:
        path = tmp / "damaged"
        shutil.copytree(good[kind], path)
        (path / name).write_bytes(edit((path / name).read_bytes()))
        return path

    return make


def config(kind: str = "hf", **changes: Any) -> Make:
    return dir_edit(kind, "config.json", lambda raw: json.dumps(json.loads(raw) | changes).encode())


CASES: dict[str, tuple[Make, str]] = {
    "gguf cut in the header": (
        gguf_edit(lambda b: b[:300]),
        r"damaged\.gguf: not a readable GGUF file: .*cut short",
    ),
    "gguf cut in the data": (
        gguf_edit(lambda b: b[:-100]),
        r"damaged\.gguf: .*runs past the end of the file",
    ),
    "gguf 2**40 tensors": (
        gguf_edit(lambda b: b[:8] + (2**40).to_bytes(8, "little") + b[16:]),
        r"damaged\.gguf: .*the header claims 1099511627776 tensors, more than a file of \d+ bytes can hold",
    ),
    "gguf garbage": (gguf_edit(lambda b: b"\x00" * 64 + b[64:]), r"damaged\.gguf: .*wrong magic"),
    "safetensors cut short": (
        dir_edit("hf", "model.safetensors", lambda b: b[: len(b) // 2]),
        r"model\.safetensors: not a readable safetensors file: .*incomplete metadata",
    ),
    "config.json cut short": (
        dir_edit("hf", "config.json", lambda b: b[: len(b) // 2]),
        r"config\.json: not valid JSON",
    ),
    "zero heads": (
        config(num_attention_heads=0),
        r"config\.json: config num_attention_heads = 0: must be >= 1",
    ),
    "heads not dividing": (
        config(num_attention_heads=3, num_key_value_heads=2),
        r"num_key_value_heads = 2 does not divide .* = 3",
    ),
    "heads not dividing hidden": (
        config(num_attention_heads=3, num_key_value_heads=3, head_dim=None),
        r"num_attention_heads = 3 does not divide hidden_size = 32 \(and there is no head_dim\)",
    ),
    "negative dim": (config(intermediate_size=-64), r"config intermediate_size = -64: must be >= 1"),
    "float heads": (config(num_attention_heads=2.0), r"num_attention_heads must be an integer, got 2\.0"),
    "huge head_dim": (
        config(head_dim=2**40),
        r"head_dim = 1099511627776 is larger than every tensor dimension",
    ),
    "huge layers": (
        config(num_hidden_layers=2**40),
        r"num_hidden_layers = 1099511627776: at most 4096",
    ),
    "more layers than tensors": (
        config(num_hidden_layers=3),
        r"3 hidden layers, the checkpoint tensors of 1",
    ),
    "zero rope base": (
        config(rope_parameters={"rope_theta": 0.0}),
        r"rope_theta = 0\.0: must be a finite number > 0",
    ),
    "mla zero latent": (config("mla", kv_lora_rank=0), r"config kv_lora_rank = 0: must be >= 1"),
    "mla no rope dim": (config("mla", qk_rope_head_dim=None), r"config has no 'qk_rope_head_dim'"),
    "mla negative v": (config("mla", v_head_dim=-16), r"config v_head_dim = -16: must be >= 1"),
    "mla huge rope dim": (
        config("mla", qk_rope_head_dim=2**40),
        r"qk_rope_head_dim = 1099511627776 is larger than every",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_damaged_checkpoint_is_named(good: dict[str, Path], tmp_path: Path, case: str) -> None:
    make, message = CASES[case]
    path = make(good, tmp_path)
    with pytest.raises(CheckpointError, match=message) as err:
        load(path, device="cpu")
    assert str(path) in str(err.value)


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
    path = dir_edit("hf", "tokenizer.json", lambda b: b[:40])(good, tmp_path)
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(path))}: cannot build the tokenizer"):
        load_tokenizer(path)
    assert main(["generate", "--model", str(path), "--prompt", "t1 t2", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{path}: cannot build the tokenizer" in err, err

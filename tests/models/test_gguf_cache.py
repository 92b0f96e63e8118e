"""The GGUF conversion cache: a hit loads the same bits (weights, RoPE factors, greedy tokens) as
a miss and as the GGUF read directly, without parsing the GGUF; damaged files are rebuilt;
``GRAPHRT_CACHE=0`` writes nothing; ``GRAPHRT_CACHE_MAX_GB`` bounds what is kept.

Every test converts into its own ``XDG_CACHE_HOME`` (``tmp_path``), never the user's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")

from graphrt import Engine  # noqa: E402
from graphrt.checkpoints import gguf_file  # noqa: E402
from graphrt.checkpoints.cache_dir import entry_dir  # noqa: E402
from graphrt.checkpoints.gguf_cache import CachedWeights, ConvertingGGUF, gguf_source  # noqa: E402
from graphrt.checkpoints.loader import load  # noqa: E402
from tests.support.gguf_util import write_gguf  # noqa: E402
from tests.support.hf_util import SMALL, randomize  # noqa: E402

HEADS = dict(num_attention_heads=4, num_key_value_heads=2)
PROMPT = [5, 17, 3, 88, 41, 9]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private ``XDG_CACHE_HOME``: what the cache writes lands under ``<it>/graphrt``."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("GRAPHRT_CACHE", raising=False)
    monkeypatch.delenv("GRAPHRT_CACHE_MAX_GB", raising=False)
    return tmp_path / "xdg" / "graphrt"


def small_gguf(folder: Path, seed: int = 1, rope_freqs: bool = True) -> Path:
    """A random 2-layer Llama as a Q4_1 GGUF (q/k permuted), with RoPE frequency factors."""
    config = transformers.LlamaConfig(**SMALL, **HEADS, tie_word_embeddings=True)
    model = transformers.LlamaForCausalLM(config).eval()
    randomize(model, seed=seed)
    head_dim = SMALL["hidden_size"] // HEADS["num_attention_heads"]
    freqs = np.linspace(1.0, 4.0, head_dim // 2, dtype=np.float32) if rope_freqs else None
    folder.mkdir(parents=True, exist_ok=True)
    return write_gguf(folder / "model.gguf", model, "llama", "Q4_1", rope_freqs=freqs)


def state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same_bits(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8)), k


def no_gguf_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make any parse of a GGUF fail the test (a hit must never construct the reader)."""
    monkeypatch.setattr(gguf_file, "_read", lambda *a: pytest.fail("the GGUF was parsed"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_hit_loads_the_bits_of_a_miss_and_of_the_gguf(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, device: torch.device, dtype: torch.dtype
) -> None:
    path = small_gguf(tmp_path / "m")
    monkeypatch.setenv("GRAPHRT_CACHE", "0")
    direct = load(path, device=device, dtype=dtype)
    monkeypatch.delenv("GRAPHRT_CACHE")
    assert isinstance(gguf_source(path, dtype), ConvertingGGUF)
    miss = load(path, device=device, dtype=dtype)
    code = "F32" if dtype == torch.float32 else "BF16"
    assert sorted(p.name for p in cache.glob("gguf/*/*")) == [f"weights-{code}.safetensors"]
    no_gguf_parse(monkeypatch)
    assert isinstance(gguf_source(path, dtype), CachedWeights)
    hit = load(path, device=device, dtype=dtype)
    assert next(hit.parameters()).device.type == device.type
    assert_same_bits(state(direct), state(miss))
    assert_same_bits(state(miss), state(hit))
    assert direct.freq_factors is not None and torch.equal(direct.freq_factors, hit.freq_factors)
    assert hit.cfg == direct.cfg


def test_hit_generates_the_tokens_of_a_miss(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = small_gguf(tmp_path / "m")
    options = dict(device="cpu", max_batch_size=1, max_context_len=32)
    miss = Engine(path, **options).generate([PROMPT], 8)[0]
    no_gguf_parse(monkeypatch)
    hit = Engine(path, **options).generate([PROMPT], 8)[0]
    assert hit == miss and len(hit) == 8


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_damaged_weights_are_converted_again(
    cache: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    path = small_gguf(tmp_path / "m", rope_freqs=False)
    want = state(load(path, device="cpu"))
    (file,) = cache.glob("gguf/*/weights-F32.safetensors")
    whole = file.read_bytes()
    file.write_bytes({"truncated": whole[: len(whole) // 2], "garbage": b"\x07" * 64, "empty": b""}[damage])
    with caplog.at_level("WARNING", logger="graphrt.cache"):
        assert isinstance(gguf_source(path, torch.float32), ConvertingGGUF)
        got = state(load(path, device="cpu"))
    assert "ignoring" in caplog.text
    assert_same_bits(want, got)
    assert file.read_bytes() == whole  # NOTE: written again, whole
    assert isinstance(gguf_source(path, torch.float32), CachedWeights)


def test_cache_off_writes_nothing(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from graphrt.text import load_tokenizer
    from tests.text.test_tokenizer import write_gguf as write_tokenizer_gguf

    monkeypatch.setenv("GRAPHRT_CACHE", "0")
    load(small_gguf(tmp_path / "m"), device="cpu")
    load_tokenizer(write_tokenizer_gguf(tmp_path / "tok.gguf", "llama-bpe"))
    assert not cache.parent.exists()


def test_size_bound_skips_and_evicts(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = small_gguf(tmp_path / "a", seed=1), small_gguf(tmp_path / "b", seed=2)
    monkeypatch.setenv("GRAPHRT_CACHE_MAX_GB", "0")
    want = state(load(first, device="cpu"))
    assert not list(cache.glob("gguf/*/*.safetensors"))  # NOTE: over the bound: loaded, not kept
    monkeypatch.delenv("GRAPHRT_CACHE_MAX_GB")
    assert_same_bits(want, state(load(first, device="cpu")))
    (kept,) = cache.glob("gguf/*/*.safetensors")
    monkeypatch.setenv("GRAPHRT_CACHE_MAX_GB", str(1.5 * kept.stat().st_size / 2**30))  # room for one
    load(second, device="cpu")
    (now,) = cache.glob("gguf/*/*.safetensors")
    assert now.parent == entry_dir(second) and not kept.exists()


def test_bad_size_bound_names_the_variable(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GRAPHRT_CACHE_MAX_GB", "lots")
    with pytest.raises(ValueError, match=r"GRAPHRT_CACHE_MAX_GB='lots' is not a number of GiB >= 0"):
        load(small_gguf(tmp_path / "m"), device="cpu")


def test_an_edited_file_gets_a_new_entry(cache: Path, tmp_path: Path) -> None:
    path = small_gguf(tmp_path / "m", seed=1)
    before = entry_dir(path)
    load(path, device="cpu")
    small_gguf(tmp_path / "m", seed=3)  # NOTE: same path, new content (size or mtime differ)
    assert entry_dir(path) != before
    assert isinstance(gguf_source(path, torch.float32), ConvertingGGUF)


def test_shards_read_from_the_cache(cache: Path, tmp_path: Path) -> None:
    from graphrt.models.parallel import Shard

    path = small_gguf(tmp_path / "m")
    load(path, device="cpu")
    direct, hit = gguf_file.GGUFFile(path), gguf_source(path, torch.float32)
    assert isinstance(hit, CachedWeights) and hit.shapes() == direct.shapes()
    name = "model.layers.1.self_attn.q_proj.weight"  # NOTE: a permuted tensor
    rows, cols = Shard(0, 16, 48, 0, 32, (64, 64)), Shard(1, 8, 40, 0, 32, (64, 64))
    for shard in (rows, cols):
        assert torch.equal(
            hit.read(name, torch.device("cpu"), shard), direct.read(name, torch.device("cpu"), shard)
        )


def test_unwritable_cache_loads_from_the_gguf(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "not-a-dir").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "not-a-dir"))
    path = small_gguf(tmp_path / "m")
    with caplog.at_level("WARNING", logger="graphrt.cache"):
        got = state(load(path, device="cpu"))
    assert "cannot write" in caplog.text
    monkeypatch.setenv("GRAPHRT_CACHE", "0")
    assert_same_bits(state(load(path, device="cpu")), got)


def test_a_failed_conversion_leaves_no_file(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = small_gguf(tmp_path / "m")
    calls = []

    def failing(self: gguf_file.GGUFFile, name: str) -> torch.Tensor:
        calls.append(name)
        if len(calls) == 3:
            raise RuntimeError("disk vanished mid-conversion")
        return original(self, name)

    original = gguf_file.GGUFFile.dequantized
    monkeypatch.setattr(gguf_file.GGUFFile, "dequantized", failing)
    with pytest.raises(RuntimeError, match="mid-conversion"):
        load(path, device="cpu")
    assert [p.name for p in cache.glob("gguf/*/*")] == []
    monkeypatch.setattr(gguf_file.GGUFFile, "dequantized", original)
    load(path, device="cpu")
    assert isinstance(gguf_source(path, torch.float32), CachedWeights)


def test_weights_of_another_model_copied_in_are_converted_again(
    cache: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Red team (issue 40, row 9): another GGUF's converted file over this one's entry."""
    mine, other = small_gguf(tmp_path / "a", seed=1), small_gguf(tmp_path / "b", seed=2)
    want = state(load(mine, device="cpu"))
    assert not torch.equal(state(load(other, device="cpu"))["lm_head.weight"], want["lm_head.weight"])
    file, theirs = (entry_dir(p) / "weights-F32.safetensors" for p in (mine, other))  # type: ignore[operator]
    whole = file.read_bytes()
    file.write_bytes(theirs.read_bytes())
    with caplog.at_level("WARNING", logger="graphrt.cache"):
        got = state(load(mine, device="cpu"))
    assert_same_bits(want, got)
    warned = [r.getMessage() for r in caplog.records if "ignoring" in r.getMessage()]
    assert len(warned) == 1 and str(file) in warned[0] and "converted from" in warned[0], warned
    assert file.read_bytes() == whole

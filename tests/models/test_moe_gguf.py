"""MoE GGUF files (llama.cpp's merged experts) == transformers on the checkpoint they were made from.

Each tiny random transformers MoE checkpoint is saved, converted to GGUF the way llama.cpp's
``convert_hf_to_gguf.py`` does (``tests/support/gguf_moe_util.py``), and loaded by graphrt:
prefill and decode logits (graphed and eager) against transformers' forward of the original
checkpoint, greedy tokens (graphed and eager) against its ``generate``. F32 files
match the original to a float32 forward (atol = rtol = 1e-4 on the CPU); a Q8_0 file (and
gpt-oss's MXFP4 experts) is compared with transformers holding the same rounded weights
(``roundtrip``). GGUF architectures:
``qwen3moe``, ``qwen2moe`` (gated shared expert), ``llama`` with experts (Mixtral), ``olmoe``,
``deepseek2`` (MLA; V2's group-limited softmax and V3's sigmoid with ``exp_probs_b``; ``kv_b``
split as newer converters write it and whole as older ones; YaRN with ``yarn_log_multiplier``)
and ``gpt-oss``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from graphrt import Engine  # noqa: E402
from graphrt.checkpoints import CheckpointError, load  # noqa: E402
from graphrt.models.moe import SparseMoE  # noqa: E402
from tests.support.gguf_moe_util import roundtrip, write_moe_gguf  # noqa: E402
from tests.support.hf_util import PROMPT_LENS, check_checkpoint, saved_reference, sequences  # noqa: E402
from tests.support.moe_checkpoints import DEEPSEEK_YARN, MOE_CASES  # noqa: E402

#: id → (MOE_CASES entry, config overrides, GGUF type, kv_b split). llama.cpp's qwen2moe has no
#: dense-layer tensors, so that file's layers are all MoE.
CASES: dict[str, tuple[str, dict[str, Any], str, bool]] = {
    "qwen3moe": ("qwen3-moe-norm-topk", {}, "F32", True),
    "qwen3moe-Q8_0": ("qwen3-moe-norm-topk", {}, "Q8_0", True),
    "qwen2moe": ("qwen2-moe-shared-gate", {"mlp_only_layers": []}, "F32", True),
    "llama-mixtral": ("mixtral", {}, "F32", True),
    "llama-mixtral-Q8_0": ("mixtral", {}, "Q8_0", True),
    "olmoe": ("olmoe", {}, "F32", True),
    "deepseek2-v2": ("deepseek-v2-group-limited", {}, "F32", True),
    "deepseek2-v3": ("deepseek-v3-sigmoid-grouped", {}, "F32", True),
    "deepseek2-v3-kv_b": ("deepseek-v3-sigmoid-grouped", {}, "F32", False),
    "deepseek2-v3-yarn": ("deepseek-v3-yarn", {}, "F32", True),
    # NOTE: mscale_all_dim 0.707 (DeepSeek-V2's): llama.cpp takes mscale to be the same.
    "deepseek2-v2-yarn": (
        "deepseek-v2-group-limited",
        {"rope_parameters": DEEPSEEK_YARN | {"mscale": 0.707, "mscale_all_dim": 0.707}},
        "F32",
        True,
    ),
    "gpt-oss": ("gpt-oss", {}, "F32", True),
    "gpt-oss-MXFP4": ("gpt-oss", {}, "MXFP4", True),
}


@pytest.fixture(scope="module", params=list(CASES))
def gguf_moe(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """``(GGUF path, transformers reference)``: the reference in fp32, rounded as the file is."""
    case, overrides, qtype, split = CASES[request.param]
    model_cls, config_cls, kwargs = MOE_CASES[case]
    root = tmp_path_factory.mktemp(request.param)
    reference = saved_reference(root / "hf", model_cls, config_cls, kwargs | overrides)
    path = write_moe_gguf(root / "hf", root / "model.gguf", qtype, split_kv_b=split)
    return path, roundtrip(reference, qtype)


def test_gguf_moe_matches_transformers(device: torch.device, gguf_moe: tuple[Path, Any]) -> None:
    """Prefill and decode logits, graphed and eager, == transformers' forward."""
    path, reference = gguf_moe
    model = load(path, device="cpu")
    assert any(isinstance(layer.mlp, SparseMoE) for layer in model.layers), "no MoE layer was built"
    # NOTE: fp32 on the GPU too, as in test_moe_checkpoints.py: a bf16 routing near-tie picks other
    # experts than transformers' fp32 forward, which no logit tolerance can absorb.
    check_checkpoint(device, path, reference, dtype=torch.float32)


@torch.no_grad()
def test_gguf_moe_greedy_tokens_equal_transformers_generate(gguf_moe: tuple[Path, Any]) -> None:
    """``Engine(file.gguf)`` (fp32 CPU), graphed DECODE and every step eager, == transformers'
    greedy ``generate`` for a batch of prompts."""
    path, reference = gguf_moe
    seqs, new = sequences(reference.config.vocab_size, seed=1), 8
    prompts = [s[:n] for s, n in zip(seqs, PROMPT_LENS, strict=True)]
    options = dict(device="cpu", max_batch_size=4, max_context_len=64, buckets=(1, 2, 4))
    graphed = Engine(str(path), **options)
    ours = graphed.generate(prompts, new)
    assert graphed.stats().replays["DECODE"] > 0
    assert Engine(str(path), use_graphs=False, **options).generate(prompts, new) == ours
    for prompt, got in zip(prompts, ours, strict=True):
        want = reference.generate(torch.tensor([prompt]), max_new_tokens=new, do_sample=False, pad_token_id=0)
        want = want[0, len(prompt) :].tolist()
        assert got[: len(want)] == want  # NOTE: transformers stops at EOS, graphrt runs the count


def _expert_gguf(path: Path, arch: str) -> Path:
    """A minimal GGUF of ``arch`` with an expert count and one merged expert tensor."""
    import numpy as np

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_expert_count(4)
    writer.add_tensor("token_embd.weight", np.zeros((8, 32), np.float32))
    writer.add_tensor("blk.0.ffn_gate_exps.weight", np.zeros((4, 16, 32), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("arch", ["dbrx", "qwen2"])
def test_unsupported_moe_architecture_is_refused_by_name(tmp_path: Path, arch: str) -> None:
    """A MoE GGUF of an architecture graphrt does not load is refused, naming it and the supported ones."""
    path = _expert_gguf(tmp_path / "moe.gguf", arch)
    with pytest.raises(
        ValueError, match=rf"GGUF architecture '{arch}' with mixture-of-experts layers.*qwen3moe"
    ):
        load(path, device="cpu")


def test_deepseek2_yarn_keys_without_a_meaning_here_are_refused() -> None:
    """``deepseek2`` YaRN metadata other than the factor, lengths, betas and log multiplier is
    refused by key (llama.cpp's attention factors have no DeepSeek counterpart in transformers)."""
    from graphrt.checkpoints.gguf_moe import moe_config

    meta = {
        "deepseek2.rope.dimension_count": 16,
        "deepseek2.attention.key_length_mla": 32,
        "deepseek2.attention.value_length_mla": 24,
        "deepseek2.attention.kv_lora_rank": 32,
        "deepseek2.rope.scaling.yarn_log_multiplier": 0.1,
    }
    raw = {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
    moe_config("deepseek2", meta.get, {}, raw)
    # NOTE: the converter writes 0.1 * mscale_all_dim; llama.cpp keeps cos/sin unscaled.
    assert raw["rope_scaling"]["mscale_all_dim"] == pytest.approx(1.0)
    assert raw["rope_scaling"]["attention_factor"] == 1.0
    extra = meta | {"deepseek2.rope.scaling.yarn_ext_factor": 1.0}
    with pytest.raises(
        ValueError, match=r"metadata deepseek2\.rope\.scaling\.yarn_ext_factor is not supported"
    ):
        moe_config("deepseek2", extra.get, {}, {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}})


@pytest.fixture(scope="module")
def qwen3_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved tiny Qwen3-MoE checkpoint (transformers' files) to convert in the tests below."""
    root = tmp_path_factory.mktemp("qwen3-moe-hf")
    saved_reference(root, *MOE_CASES["qwen3-moe-norm-topk"])
    return root


def test_direct_read_equals_converted_cache(
    qwen3_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The merged experts read straight from the GGUF (cache off) == through the converted
    cache: the same parameters, bit for bit."""
    path = write_moe_gguf(qwen3_checkpoint, tmp_path / "model.gguf", "Q8_0")
    cached = load(path, device="cpu").state_dict()
    monkeypatch.setenv("GRAPHRT_CACHE", "0")
    direct = load(path, device="cpu").state_dict()
    assert direct.keys() == cached.keys()
    for name, value in direct.items():
        assert torch.equal(value, cached[name]), name


def test_missing_merged_part_is_named(qwen3_checkpoint: Path, tmp_path: Path) -> None:
    """A file without one layer's ``ffn_up_exps`` is refused naming it and the tensor it makes."""
    path = write_moe_gguf(qwen3_checkpoint, tmp_path / "model.gguf", drop=("blk.1.ffn_up_exps.weight",))
    with pytest.raises(CheckpointError, match=r"no tensor 'blk\.1\.ffn_up_exps\.weight' \(a part of "):
        load(path, device="cpu")

"""DeepSeek-V3.2 checkpoints saved by transformers == the transformers forward and ``generate``.

MLA + MoE (V3's sigmoid router with the correction bias, grouped top-k, a shared expert, layer
0 dense) + the DSA indexer, through graphrt's sparse-MLA path. ``index_topk`` (4) is below
every prompt length, so keys are really dropped: prefill, DECODE (graphed and eager) and
TARGET_VERIFY (graphed and eager) logits equal transformers' forward, whose indexer folds the
same top-k into its attention mask; the same weights keeping every key do not. Greedy tokens
equal ``generate``; a batch gives each prompt its tokens alone; with DeepSeek's YaRN the logits
still equal transformers'. Tolerances as
tests/models/test_models_hf.py: fp32 CPU 1e-4; bf16 CUDA three times transformers' own bf16 error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from graphrt import Batch, Engine, ForwardMode  # noqa: E402
from graphrt.checkpoints import CheckpointError, load  # noqa: E402
from graphrt.checkpoints.hf_config import parse_config  # noqa: E402
from graphrt.kv.mla import MLAKVCache  # noqa: E402
from graphrt.models.indexed_mla import DSACausalLM  # noqa: E402
from graphrt.models.moe import SparseMoE  # noqa: E402
from graphrt.step.modes import SpecGeometry  # noqa: E402
from tests.support.hf_util import (  # noqa: E402
    PROMPT_LENS,
    check_checkpoint,
    reference_logits,
    saved_reference,
    sequences,
)
from tests.support.moe_checkpoints import DEEPSEEK_YARN, V3_MOE  # noqa: E402
from tests.support.util import Setup, build_runtime, slot_of  # noqa: E402

TOPK = 4
V32: dict[str, Any] = dict(
    num_attention_heads=2,
    num_key_value_heads=2,
    q_lora_rank=32,
    kv_lora_rank=512,
    qk_rope_head_dim=64,
    qk_nope_head_dim=16,
    v_head_dim=24,
    **V3_MOE,
    # NOTE: 16 indexer heads: a key scores exactly 0 (a tie the two top-k's may break apart)
    # only when all 16 relu'd products are 0; 80 = RoPE's 64 plus 16 that pass unrotated.
    index_n_heads=16,
    index_head_dim=80,
    index_topk=TOPK,
)
CASE = ("DeepseekV32ForCausalLM", "DeepseekV32Config", V32)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    path = tmp_path_factory.mktemp("deepseek-v3.2")
    return path, saved_reference(path, *CASE)


def with_config(path: Path, dest: Path, **changes: Any) -> Path:
    """``path``'s tensors (linked) under a ``config.json`` with ``changes``."""
    dest.mkdir(exist_ok=True)
    for f in path.glob("*.safetensors"):
        (dest / f.name).symlink_to(f)
    raw = json.loads((path / "config.json").read_text())
    (dest / "config.json").write_text(json.dumps(raw | changes))
    return dest


def test_checkpoint_matches_transformers(device: torch.device, checkpoint: tuple[Path, Any]) -> None:
    """Prefill and DECODE logits (graphed and eager) == transformers' forward."""
    model = load(checkpoint[0], device="cpu")
    assert isinstance(model, DSACausalLM)
    assert [isinstance(layer.mlp, SparseMoE) for layer in model.layers] == [False, True]
    check_checkpoint(device, *checkpoint)


def test_yarn_checkpoint_matches_transformers(
    device: torch.device, checkpoint: tuple[Path, Any], tmp_path: Path
) -> None:
    """The same weights under DeepSeek's YaRN (``mscale`` 1, ``mscale_all_dim`` 0.707: the MLA's
    softmax scale and both RoPEs' cos/sin rescaled, the indexer's softmax scale not) ==
    transformers' forward of that checkpoint."""
    rope = DEEPSEEK_YARN | {"mscale_all_dim": 0.707}
    path = with_config(checkpoint[0], tmp_path, rope_parameters=rope)
    reference = transformers.DeepseekV32ForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    assert reference.model.rotary_emb.attention_scaling != 1.0
    check_checkpoint(device, path, reference)


@torch.no_grad()
def test_keeping_every_key_differs(checkpoint: tuple[Path, Any], tmp_path: Path) -> None:
    """The same weights with ``index_topk`` past the context miss transformers' logits: the
    parity above holds because graphrt drops the keys transformers' indexer drops."""
    path, reference = checkpoint
    seq = sequences(reference.config.vocab_size)[1][: PROMPT_LENS[1]]
    want = reference_logits(reference, [seq])[0]
    for source, topk, close in ((path, TOPK, True), (with_config(path, tmp_path, index_topk=64), 64, False)):
        setup = build_runtime(
            torch.device("cpu"), model=str(source), capture=False, max_batch_size=1, max_context_len=32
        )
        assert setup.kv.index_topk == topk
        got = setup.runtime.run(prefill_batch(setup, [seq])).float().cpu()
        assert torch.allclose(got[TOPK:], want[TOPK:], atol=1e-4, rtol=1e-4) == close
        # NOTE: positions below index_topk keep every key either way.
        torch.testing.assert_close(got[:TOPK], want[:TOPK], atol=1e-4, rtol=1e-4)


def prefill_batch(setup: Setup, seqs: list[list[int]]) -> Batch:
    """One EXTEND of ``seqs`` into rows ``0..``."""
    reqs = range(len(seqs))
    return Batch.create(
        ForwardMode.EXTEND,
        input_ids=np.concatenate(seqs),
        seq_lens=[len(s) for s in seqs],
        req_pool_indices=list(reqs),
        out_cache_loc=[slot_of(setup, r, p) for r, s in zip(reqs, seqs, strict=True) for p in range(len(s))],
        q_lens=[len(s) for s in seqs],
    )


@torch.no_grad()
def test_greedy_tokens_equal_transformers_generate(checkpoint: tuple[Path, Any]) -> None:
    """``Engine(dir)`` (graphed DECODE, fp32 CPU) == transformers' greedy ``generate``; the batch
    gives each prompt the tokens it gets alone."""
    path, reference = checkpoint
    seqs, new = sequences(reference.config.vocab_size, seed=1), 8
    prompts = [s[:n] for s, n in zip(seqs, PROMPT_LENS, strict=True)]
    engine = Engine(str(path), device="cpu", max_batch_size=4, max_context_len=64, buckets=(1, 2, 4))
    assert isinstance(engine.runtime.kv, MLAKVCache) and engine.runtime.kv.layout == "fp32"
    ours = engine.generate(prompts, new)
    assert engine.stats().replays["DECODE"] > 0
    assert [engine.generate([p], new)[0] for p in prompts] == ours
    for prompt, got in zip(prompts, ours, strict=True):
        out = reference.generate(
            torch.tensor([prompt]), max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0
        )
        assert got == out[0, len(prompt) :].tolist()


@torch.no_grad()
def test_target_verify_matches_transformers(checkpoint: tuple[Path, Any]) -> None:
    """TARGET_VERIFY (a chain of 4 draft tokens), graphed and eager, == transformers' logits at
    those positions: each draft token's indexer sees the prefix and the drafts before it."""
    path, reference = checkpoint
    spec = SpecGeometry(num_steps=3)
    n = spec.num_draft_tokens
    setup = build_runtime(
        torch.device("cpu"),
        model=str(path),
        modes=(ForwardMode.TARGET_VERIFY,),
        speculative=spec,
        buckets=(1, 4),
        max_batch_size=4,
        max_reqs=4,
        max_context_len=64,
    )
    seqs = sequences(reference.config.vocab_size, seed=2)
    reqs = list(range(len(seqs)))
    want = reference_logits(reference, [s[: p + n] for s, p in zip(seqs, PROMPT_LENS, strict=True)])
    prompt = prefill_batch(setup, [s[:p] for s, p in zip(seqs, PROMPT_LENS, strict=True)])
    setup.runtime.run(prompt)
    verify = verify_chain(setup, seqs, reqs, n)
    rows = torch.cat([w[p : p + n] for w, p in zip(want, PROMPT_LENS, strict=True)])
    for eager in (True, False):
        got = setup.runtime.run(verify, eager=eager).float().cpu()
        torch.testing.assert_close(got, rows, atol=1e-4, rtol=1e-4)
    assert setup.runtime.stats().replays["TARGET_VERIFY"] == 1


def verify_chain(setup: Setup, seqs: list[list[int]], reqs: list[int], n: int) -> Batch:
    """TARGET_VERIFY of each sequence's next ``n`` tokens after its prompt."""
    return Batch.create(
        ForwardMode.TARGET_VERIFY,
        input_ids=np.concatenate([s[p : p + n] for s, p in zip(seqs, PROMPT_LENS, strict=True)]),
        seq_lens=[p + n for p in PROMPT_LENS],
        req_pool_indices=reqs,
        out_cache_loc=[
            slot_of(setup, r, i) for r, p in zip(reqs, PROMPT_LENS, strict=True) for i in range(p, p + n)
        ],
        q_lens=[n] * len(reqs),
    )


def v32_raw(**changes: Any) -> dict[str, Any]:
    config = transformers.DeepseekV32Config(vocab_size=96, hidden_size=64, num_hidden_layers=2, **V32)
    return config.to_dict() | {"architectures": ["DeepseekV32ForCausalLM"], **changes}


def test_v32_fields_are_read() -> None:
    cfg = parse_config(v32_raw())
    assert cfg.indexer is not None and (cfg.indexer.n_heads, cfg.indexer.head_dim, cfg.indexer.topk) == (
        16,
        80,
        4,
    )
    assert cfg.moe is not None and cfg.moe.sparse == (False, True) and cfg.moe.scoring == "sigmoid"
    assert parse_config(v32_raw(mlp_layer_types=["sparse", "dense"])).moe.sparse == (True, False)
    assert cfg.rope_interleave  # NOTE: V3.2's MLA always rotates interleaved pairs


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(index_topk=None), r"config has no 'index_topk'"),
        (dict(index_n_heads=0), r"config index_n_heads = 0: must be >= 1"),
        (dict(q_lora_rank=None), r"config has no 'q_lora_rank'"),
        (dict(mlp_layer_types=["dense"]), r"mlp_layer_types = \['dense'\]: must list 'dense' or 'sparse'"),
    ],
)
def test_bad_v32_configs_are_refused(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(CheckpointError, match=message):
        parse_config(v32_raw(**changes))


def test_unsupported_v32_shapes_are_refused(checkpoint: tuple[Path, Any], tmp_path: Path) -> None:
    """What the sparse-MLA path cannot hold is refused when the model is built, by name."""
    path, _ = checkpoint
    small = with_config(path, tmp_path / "small", kv_lora_rank=32)
    with pytest.raises(
        ValueError, match=r"sparse MLA needs kv_lora_rank 512 and qk_rope_head_dim 64.*32 and 64"
    ):
        load(small, device="cpu")
    narrow = with_config(path, tmp_path / "narrow", index_head_dim=32)
    with pytest.raises(ValueError, match=r"index_head_dim 32 must be >= qk_rope_head_dim 64"):
        load(narrow, device="cpu")
    with pytest.raises(
        ValueError, match=r"kv_cache_dtype 'fp8_e4m3': a sparse-MLA \(DSA\) cache holds one of"
    ):
        Engine(str(path), device="cpu", max_context_len=64, kv_cache_dtype="fp8_e4m3")

"""DeepSeek-V2/V3 (dense MLA) checkpoints saved by transformers == the transformers forward.

Prefill and decode logits (eager and graphed) and greedy tokens against transformers' own
``generate`` (with its MLA KV cache). Cases cover q_lora (``q_a_proj`` → norm → ``q_b_proj``)
and a single ``q_proj``, DeepSeek's interleaved RoPE (V2's complex form, V3's
``rope_interleave``) and NeoX RoPE (with linear scaling), YaRN (the softmax scale times
``mscale(factor, mscale_all_dim) ** 2``, cos/sin times the attention factor, the ramp's ends
rounded or not), attention biases and tied embeddings; one case has
DeepSeek's 512 + 64 latent (FA3's shape on an H100). MoE fields are read (their checkpoints:
tests/models/test_moe_checkpoints.py; V3.2's: tests/models/test_dsv32_checkpoints.py); expert
parallelism is refused.
Tolerances as tests/models/test_models_hf.py: fp32 CPU 1e-4; bf16 CUDA three times transformers' own
bf16 error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from graphrt import Engine  # noqa: E402
from graphrt.checkpoints import CheckpointError, load  # noqa: E402
from graphrt.checkpoints.hf_config import parse_config  # noqa: E402
from graphrt.models.mla import MLACausalLM  # noqa: E402
from tests.support.hf_util import PROMPT_LENS, SMALL, check_checkpoint, saved_reference, sequences  # noqa: E402
from tests.support.moe_checkpoints import DEEPSEEK_YARN  # noqa: E402

MLA = dict(qk_nope_head_dim=16, v_head_dim=24, first_k_dense_replace=SMALL["num_hidden_layers"])
#: id → (model class, config class, config kwargs)
CASES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "v3-q-lora-512-64-interleaved": (
        "DeepseekV3ForCausalLM",
        "DeepseekV3Config",
        dict(num_attention_heads=2, q_lora_rank=32, kv_lora_rank=512, qk_rope_head_dim=64, **MLA),
    ),
    "v3-q-proj-neox-linear-bias-tied": (
        "DeepseekV3ForCausalLM",
        "DeepseekV3Config",
        dict(
            num_attention_heads=4,
            q_lora_rank=None,
            kv_lora_rank=32,
            qk_rope_head_dim=16,
            rope_interleave=False,
            rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 5000.0},
            attention_bias=True,
            tie_word_embeddings=True,
            **MLA,
        ),
    ),
    "v2-q-proj-complex-rope": (
        "DeepseekV2ForCausalLM",
        "DeepseekV2Config",
        dict(num_attention_heads=4, q_lora_rank=None, kv_lora_rank=32, qk_rope_head_dim=16, **MLA),
    ),
    # NOTE: mscale != mscale_all_dim: cos/sin scaled by their ratio, the softmax by mscale_all_dim's.
    "v3-yarn-mscale-interleaved": (
        "DeepseekV3ForCausalLM",
        "DeepseekV3Config",
        dict(
            num_attention_heads=2,
            q_lora_rank=32,
            kv_lora_rank=32,
            qk_rope_head_dim=16,
            rope_parameters=DEEPSEEK_YARN | {"mscale_all_dim": 0.707},
            **MLA,
        ),
    ),
    # NOTE: no mscale: cos/sin scaled by mscale(factor); the ramp's ends not rounded.
    "v2-yarn-no-truncate": (
        "DeepseekV2ForCausalLM",
        "DeepseekV2Config",
        dict(
            num_attention_heads=4,
            q_lora_rank=None,
            kv_lora_rank=32,
            qk_rope_head_dim=16,
            rope_parameters={k: v for k, v in DEEPSEEK_YARN.items() if k != "mscale"} | {"truncate": False},
            **MLA,
        ),
    ),
}


@pytest.fixture(scope="module", params=list(CASES))
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    path = tmp_path_factory.mktemp(request.param)
    return path, saved_reference(path, *CASES[request.param])


def test_checkpoint_matches_transformers(device: torch.device, checkpoint: tuple[Path, Any]) -> None:
    path, _ = checkpoint
    assert isinstance(load(path, device="cpu"), MLACausalLM)
    check_checkpoint(device, *checkpoint)


@torch.no_grad()
def test_greedy_tokens_equal_transformers_generate(checkpoint: tuple[Path, Any]) -> None:
    """``Engine(dir)`` (graphed DECODE, fp32 CPU) == transformers' greedy ``generate``, token for token."""
    path, reference = checkpoint
    seqs, new = sequences(reference.config.vocab_size, seed=1), 12
    prompts = [s[:n] for s, n in zip(seqs, PROMPT_LENS, strict=True)]
    engine = Engine(str(path), device="cpu", max_batch_size=4, max_context_len=64, buckets=(1, 2, 4))
    ours = engine.generate(prompts, new)
    assert engine.stats().replays["DECODE"] > 0
    for prompt, got in zip(prompts, ours, strict=True):
        out = reference.generate(
            torch.tensor([prompt]), max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0
        )
        assert got == out[0, len(prompt) :].tolist()


def raw_config(path: Path, **changes: Any) -> Path:
    """A ``config.json`` of a tiny DeepSeek-V3 with ``changes`` (no weights: parsing refuses first)."""
    config = transformers.DeepseekV3Config(**SMALL, num_attention_heads=2, kv_lora_rank=32, **MLA).to_dict()
    config |= {"architectures": ["DeepseekV3ForCausalLM"], **changes}
    path.mkdir(exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_moe_fields_are_read_and_unsupported_ones_refused(tmp_path: Path) -> None:
    """MoE layers load (tests/models/test_moe_checkpoints.py); expert parallelism is refused."""
    raw = json.loads(
        (raw_config(tmp_path, n_routed_experts=8, first_k_dense_replace=1) / "config.json").read_text()
    )
    moe = parse_config(raw).moe
    assert (
        moe is not None and moe.sparse == (False, True) and moe.scoring == "sigmoid" and moe.num_experts == 8
    )
    assert parse_config(raw | {"first_k_dense_replace": 2}).moe is None
    with pytest.raises(ValueError, match=r"expert parallelism \(ep_size 2\) is not supported"):
        parse_config(raw | {"ep_size": 2})
    # NOTE: V3.2 loads (tests/models/test_dsv32_checkpoints.py); without its indexer sizes it is refused.
    with pytest.raises(CheckpointError, match=r"config has no 'index_n_heads'"):
        parse_config(raw | {"architectures": ["DeepseekV32ForCausalLM"]})
    v2 = raw | {"architectures": ["DeepseekV2ForCausalLM"], "topk_method": "noaux_tc"}
    with pytest.raises(ValueError, match=r"DeepSeek-V2 topk_method 'noaux_tc' is not supported"):
        parse_config(v2)


def test_unsupported_mla_features_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"hidden_act 'gelu' is not supported; supported: silu"):
        load(raw_config(tmp_path, hidden_act="gelu"), device="cpu")
    no_factor = {k: v for k, v in DEEPSEEK_YARN.items() if k != "factor"}
    with pytest.raises(
        CheckpointError, match=r"config rope_type 'yarn' factor = None: must be a finite number > 0"
    ):
        load(raw_config(tmp_path, rope_parameters=no_factor), device="cpu")
    negative = DEEPSEEK_YARN | {"mscale_all_dim": -1.0}
    with pytest.raises(CheckpointError, match=r"mscale_all_dim = -1.0: must be a finite number >= 0"):
        load(raw_config(tmp_path, rope_parameters=negative), device="cpu")


@pytest.mark.parametrize(
    "rope",
    [
        DEEPSEEK_YARN,
        DEEPSEEK_YARN | {"mscale": 0.707, "mscale_all_dim": 0.707},  # NOTE: DeepSeek-V2's
        DEEPSEEK_YARN | {"mscale_all_dim": 0.707},
        {k: v for k, v in DEEPSEEK_YARN.items() if k != "mscale_all_dim"},
        DEEPSEEK_YARN | {"attention_factor": 1.25},
        {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0, "mscale_all_dim": 1.0},
        {"rope_type": "default", "rope_theta": 10000.0, "mscale_all_dim": 1.0},
    ],
)
def test_yarn_scales_equal_transformers(rope: dict[str, Any]) -> None:
    """The softmax scale and the cos/sin factor graphrt reads from a config == those transformers'
    DeepSeek-V3 attention and rotary embedding compute from it."""
    from graphrt.models.rope import rope_attention_factor

    config = transformers.DeepseekV3Config(
        **SMALL, num_attention_heads=2, kv_lora_rank=32, rope_parameters=dict(rope), **MLA
    )
    attn = transformers.models.deepseek_v3.modeling_deepseek_v3.DeepseekV3Attention(config, 0)
    rotary = transformers.models.deepseek_v3.modeling_deepseek_v3.DeepseekV3RotaryEmbedding(config)
    cfg = parse_config(config.to_dict() | {"architectures": ["DeepseekV3ForCausalLM"]})
    assert cfg.softmax_scale == pytest.approx(attn.scaling, rel=1e-12)
    assert rope_attention_factor(cfg.rope_type, cfg.rope_params) == pytest.approx(
        rotary.attention_scaling, rel=1e-12
    )


def test_wrong_latent_tensor_is_named(checkpoint: tuple[Path, Any], tmp_path: Path) -> None:
    """A config whose kv_lora_rank disagrees with the weights: the tensor and both shapes."""
    path, _ = checkpoint
    raw = json.loads((path / "config.json").read_text())
    for f in path.glob("*.safetensors"):
        (tmp_path / f.name).symlink_to(f)
    (tmp_path / "config.json").write_text(json.dumps(raw | {"kv_lora_rank": raw["kv_lora_rank"] * 2}))
    rows, hidden = raw["kv_lora_rank"] + raw["qk_rope_head_dim"], raw["hidden_size"]
    want = (
        rf"tensor 'model\.layers\.0\.self_attn\.kv_a_proj_with_mqa\.weight': expected shape "
        rf"\[{rows + raw['kv_lora_rank']}, {hidden}\] from the config, found \[{rows}, {hidden}\]"
    )
    with pytest.raises(CheckpointError, match=want):
        load(tmp_path, device="cpu")

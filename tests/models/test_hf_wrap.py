"""``graphrt.hf.wrap``: unmodified transformers models under GraphRuntime == their own forward.

Each case builds a tiny random model with transformers (gpt-oss: sinks and sliding layers),
takes its logits over every full sequence (no cache, transformers' own attention), then wraps the *same* model and runs a prefill
of three prompts and four decode steps through graphrt, eager and graphed, with bs 3 in
bucket 4 (one pad row). Tolerances: fp32 on the CPU, atol = rtol = 1e-4 (measured max |diff|
~1e-6: summation order only); bf16 on CUDA, atol = rtol = three times transformers' own bf16 error against the fp32
CPU reference (``tests.support.hf_util.tolerance``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

import graphrt.hf  # noqa: E402
from graphrt import Batch, ForwardMode, RuntimeConfig  # noqa: E402
from graphrt.capture import CaptureSyncError  # noqa: E402
from graphrt.models import hf_wrap  # noqa: E402
from graphrt.step.modes import SpecGeometry  # noqa: E402
from tests.support.hf_util import (  # noqa: E402
    BUCKETS,
    LLAMA3,
    MAX_CONTEXT,
    PAGE_SIZE,
    PROMPT_LENS,
    SMALL,
    assert_parity,
    randomize,
    reference_logits,
    run_graphrt,
    sequences,
    tolerance,
)

#: id → (model class, config class, config kwargs)
CASES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama-gqa": ("LlamaForCausalLM", "LlamaConfig", dict(num_attention_heads=4, num_key_value_heads=2)),
    "llama-gqa-llama3-bias": (
        "LlamaForCausalLM",
        "LlamaConfig",
        dict(num_attention_heads=4, num_key_value_heads=1, rope_parameters=LLAMA3, attention_bias=True),
    ),
    "mistral-gqa-window": (
        "MistralForCausalLM",
        "MistralConfig",
        dict(num_attention_heads=4, num_key_value_heads=2, sliding_window=7),
    ),
    "qwen2-gqa-tied": (
        "Qwen2ForCausalLM",
        "Qwen2Config",
        dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
    ),
    "qwen3-gqa-headdim": (
        "Qwen3ForCausalLM",
        "Qwen3Config",
        dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32),
    ),
    # NOTE: attention sinks (s_aux) on alternating sliding and full layers; transformers runs
    # the MoE, graphrt the attention: its sinks against transformers' own.
    "gpt-oss-sinks-window": (
        "GptOssForCausalLM",
        "GptOssConfig",
        dict(
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            sliding_window=7,
            # NOTE: every expert routed, so the MoE is continuous in its inputs: with top-2 of 4,
            # bf16 rounding flips a router choice at a few positions and moves their logits by ~0.9.
            num_local_experts=2,
            num_experts_per_tok=2,
            layer_types=["sliding_attention", "full_attention"],
        ),
    ),
}


def build(case: str, seed: int = 0) -> torch.nn.Module:
    model_cls, config_cls, kwargs = CASES[case]
    config = getattr(transformers, config_cls)(**SMALL, **kwargs)
    model = getattr(transformers, model_cls)(config).eval()
    randomize(model, seed)
    return model


def on_device(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    return model.to(device=device, dtype=torch.bfloat16 if device.type == "cuda" else torch.float32)


@pytest.mark.parametrize("case", list(CASES))
def test_wrapped_model_matches_its_transformers_forward(device: torch.device, case: str) -> None:
    model = build(case)
    seqs = sequences(model.config.vocab_size)
    expected = reference_logits(model, seqs)  # before wrap: transformers' own attention
    atol = tolerance(device, model, seqs)
    wrapped = graphrt.hf.wrap(on_device(model, device))
    assert model.config._attn_implementation == graphrt.hf.ATTENTION_NAME
    assert_parity(run_graphrt(wrapped, seqs), expected, atol=atol, rtol=atol)


def test_wrapped_target_verify_matches_transformers() -> None:
    """A TARGET_VERIFY step (a chain of 4 query tokens per request) graphed, bs 3 in bucket 4."""
    model = build("qwen3-gqa-headdim", seed=1)
    seqs, n = sequences(model.config.vocab_size, seed=1), 4
    expected = reference_logits(model, seqs)
    config = RuntimeConfig(
        max_batch_size=4,
        max_context_len=MAX_CONTEXT,
        page_size=PAGE_SIZE,
        buckets=BUCKETS,
        capture_modes=(ForwardMode.DECODE, ForwardMode.TARGET_VERIFY),
        speculative=SpecGeometry(num_steps=3, topk=1, num_draft_tokens=n),
        debug=True,
    )
    runtime = graphrt.hf.stack(model, config).runtime
    runtime.capture()
    pages = config.max_pages
    runtime.run(
        Batch.create(
            ForwardMode.EXTEND,
            input_ids=np.concatenate([s[:p] for s, p in zip(seqs, PROMPT_LENS, strict=True)]),
            seq_lens=list(PROMPT_LENS),
            req_pool_indices=[0, 1, 2],
            out_cache_loc=[r * pages * PAGE_SIZE + i for r, p in enumerate(PROMPT_LENS) for i in range(p)],
            q_lens=list(PROMPT_LENS),
        )
    )
    verify = Batch.create(
        ForwardMode.TARGET_VERIFY,
        input_ids=np.concatenate([s[p : p + n] for s, p in zip(seqs, PROMPT_LENS, strict=True)]),
        seq_lens=[p + n for p in PROMPT_LENS],
        req_pool_indices=[0, 1, 2],
        out_cache_loc=[r * pages * PAGE_SIZE + i for r, p in enumerate(PROMPT_LENS) for i in range(p, p + n)],
        q_lens=[n] * 3,
    )
    got = runtime.run(verify).float()
    want = torch.cat([expected[r][p : p + n] for r, p in enumerate(PROMPT_LENS)])
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert runtime.stats().replays == {"TARGET_VERIFY": 1}


def test_geometry_and_stack() -> None:
    model = build("qwen3-gqa-headdim")
    wrapped = graphrt.hf.wrap(model)
    assert wrapped.cfg == graphrt.hf.KVGeometry(num_layers=2, num_kv_heads=2, head_dim=32, vocab_size=96)
    assert wrapped.vocab_size == 96
    config = RuntimeConfig(
        max_batch_size=4, max_context_len=MAX_CONTEXT, page_size=PAGE_SIZE, buckets=BUCKETS
    )
    stack = graphrt.hf.stack(wrapped, config, max_reqs=2)
    assert stack.model is wrapped
    assert stack.kv.k[0].dtype == torch.float32
    assert stack.kv.shape.num_kv_heads == 2 and stack.kv.shape.head_dim == 32
    assert stack.kv.shape.num_pages == 2 * config.max_pages + 1


def test_wrapped_greedy_decode_matches_transformers_generate() -> None:
    """Greedy tokens from graphed DECODE steps equal ``generate`` of the unwrapped model."""
    model = build("llama-gqa", seed=3)
    prompt = [5, 17, 42, 8, 61]
    with torch.no_grad():
        want = model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, use_cache=True)
    config = RuntimeConfig(max_batch_size=2, max_context_len=MAX_CONTEXT, page_size=PAGE_SIZE, buckets=(1, 2))
    runtime = graphrt.hf.stack(model, config).runtime
    runtime.capture()
    n = len(prompt)
    logits = runtime.run(
        Batch.create(
            ForwardMode.EXTEND,
            input_ids=np.array(prompt),
            seq_lens=[n],
            req_pool_indices=[0],
            out_cache_loc=np.arange(n),
            q_lens=[n],
        )
    )
    tokens = [*prompt, int(logits[-1].argmax())]
    while len(tokens) < n + 8:
        step = Batch.create(
            ForwardMode.DECODE,
            input_ids=[tokens[-1]],
            seq_lens=[len(tokens)],
            req_pool_indices=[0],
            out_cache_loc=[len(tokens) - 1],
        )
        tokens.append(int(runtime.run(step)[0].argmax()))
    assert tokens == want[0].tolist()
    assert runtime.stats().replays == {"DECODE": 7}


@pytest.mark.parametrize("rope_type", ["dynamic", "longrope"])
def test_uncapturable_rope_is_refused_before_the_model_changes(rope_type: str) -> None:
    params = {"rope_type": rope_type, "rope_theta": 10000.0, "factor": 2.0}
    if rope_type == "longrope":
        params |= {
            "short_factor": [1.0] * 8,
            "long_factor": [2.0] * 8,
            "original_max_position_embeddings": 64,
        }
    config = transformers.LlamaConfig(**SMALL, num_attention_heads=4, rope_parameters=params)
    model = transformers.LlamaForCausalLM(config)
    before = model.config._attn_implementation
    with pytest.raises(ValueError, match=f"rope type '{rope_type}' cannot be captured"):
        graphrt.hf.wrap(model)
    assert model.config._attn_implementation == before


def test_dynamic_rope_really_cannot_be_captured() -> None:
    """Why it is refused: past ``check_capturable``, the emulated engine hits its host sync."""
    params = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    model = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(**SMALL, num_attention_heads=4, rope_parameters=params)
    )
    hf_wrap.register()
    model.set_attn_implementation(graphrt.hf.ATTENTION_NAME)
    config = RuntimeConfig(max_batch_size=2, max_context_len=MAX_CONTEXT, page_size=PAGE_SIZE, buckets=(1, 2))
    runtime = graphrt.hf.stack(graphrt.hf.HFWrapped(model.eval()), config).runtime
    with pytest.raises(CaptureSyncError, match="_local_scalar_dense"):
        runtime.capture()


def test_config_extra_outputs_are_turned_off() -> None:
    """A config asking for hidden states still captures: the wrapper passes False."""
    model = build("llama-gqa")
    seqs = sequences(model.config.vocab_size)
    expected = reference_logits(model, seqs)
    model.config.output_hidden_states = True  # NOTE: transformers itself refuses output_attentions here
    assert_parity(run_graphrt(graphrt.hf.wrap(model), seqs), expected, atol=1e-4, rtol=1e-4)


def test_attention_without_ctx_says_how_to_call() -> None:
    model = build("llama-gqa")
    graphrt.hf.wrap(model)
    with pytest.raises(RuntimeError, match=r"graphrt\.hf\.wrap\(model\)"):
        model(torch.tensor([[1, 2, 3]]), use_cache=False)


def test_custom_scaling_is_folded_into_q() -> None:
    """A module whose ``scaling`` is not ``head_dim ** -0.5`` gets softmax(q·k · scaling)."""

    class Ctx:
        def attention(
            self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **_: Any
        ) -> Any:
            scores = (q.transpose(0, 1) @ k.transpose(0, 1).transpose(1, 2)) * q.shape[-1] ** -0.5
            return (scores.softmax(-1) @ v.transpose(0, 1)).transpose(0, 1)

    module = torch.nn.Module()
    module.layer_idx = 0
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 3, 8, generator=gen) for _ in range(3))
    out, weights = graphrt.hf.graphrt_attention(module, q, k, v, None, scaling=0.3, graphrt_ctx=Ctx())
    want = ((q @ k.transpose(-1, -2)) * 0.3).softmax(-1) @ v
    assert weights is None and out.shape == (1, 3, 2, 8)
    torch.testing.assert_close(out, want.transpose(1, 2), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("extra", [{"softcap": 50.0}, {"is_causal": False}])
def test_attention_features_graphrt_lacks_are_refused(extra: dict[str, Any]) -> None:
    module = torch.nn.Module()
    module.layer_idx = 1
    q = torch.zeros(1, 2, 3, 8)
    with pytest.raises(ValueError, match="layer 1: graphrt attention does not implement"):
        graphrt.hf.graphrt_attention(module, q, q, q, None, graphrt_ctx=object(), **extra)

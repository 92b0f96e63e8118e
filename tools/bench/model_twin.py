"""graphrt's Llama and transformers' ``LlamaForCausalLM`` on the same weights, and the check
that they compute the same logits.

The transformers model holds no weights of its own: each of its parameters is a view of
graphrt's (q/k/v rows of the fused ``attn.qkv``, gate/up rows of ``mlp.gate_up``; row blocks of a
row-major matrix are contiguous views), so an 8B pair costs the GPU 16 GB, not 32. Sharing does
not weaken the check: the two forwards are independent code, and a weight mapped onto the wrong
place (or a weight that differs, as a test shows by replacing one) changes the logits.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from graphrt.models.llama import TinyLlama
from graphrt.models.presets import LlamaConfig

#: Largest relative L2 error ``||graphrt - transformers|| / ||transformers||`` of one decode
#: step's logits ``[bs, vocab]`` that still counts as "the same computation". bf16: both sides
#: round every activation to 8 mantissa bits through a different kernel order (fused norms, FA3
#: against SDPA, KV written by different prefills), ~1-3% on a random 32-layer model; a weight
#: in the wrong place or a different RoPE gives ~100%. fp32 leaves only summation order.
PARITY_TOLERANCE: dict[torch.dtype, float] = {
    torch.float32: 1e-3,
    torch.float16: 3e-2,
    torch.bfloat16: 5e-2,
}
PARITY_METRIC = "relative L2 error ||a - b|| / ||b|| of one decode step's logits [bs, vocab], fp32"


class ParityError(AssertionError):
    """graphrt and transformers disagree beyond the tolerance: the timings would compare two
    different computations, so the bench stops before timing anything."""


def relative_l2(
    outs: list[torch.Tensor],
    ref: list[torch.Tensor],
    limit: float,
    what: str,
    against: str = "the reference's",
) -> float:
    """``||a - b|| / ||b||`` of the stacked outputs against ``ref`` (``against`` names it), in
    fp32; :class:`ParityError` naming ``what`` above ``limit``."""
    a, b = torch.stack(outs).float(), torch.stack(ref).float()
    rel = ((a - b).norm() / b.norm().clamp_min(1e-30)).item()
    if not rel <= limit:
        raise ParityError(f"{what}: outputs differ from {against} (relative L2 {rel:.3g} > {limit:g})")
    return rel


def random_llama(cfg: LlamaConfig, device: torch.device, dtype: torch.dtype, seed: int = 0) -> TinyLlama:
    """graphrt's Llama with random weights drawn directly on ``device`` in ``dtype``.

    Matrices ``N(0, 1/fan_in)`` (the embedding ``N(0, 1)``, or ``N(0, 1/hidden)`` when it is also
    the head), norms ``1 + N(0, 0.1)`` so a norm mapped onto the wrong place shows in the logits. Unlike ``Decoder.from_seed`` nothing passes
    through host memory (an 8B model would take 32 GB of fp32 and minutes of CPU randn); the
    module's own host tensors come from ``torch.empty`` and are never written, so never paged in.
    """
    if cfg.sliding_window is not None or cfg.attention_chunk_size is not None:
        raise ValueError("the model bench compares full-attention Llama presets only")
    model = TinyLlama(cfg)
    gen = torch.Generator(device).manual_seed(seed)
    lookup_only = not cfg.tie_word_embeddings
    with torch.no_grad():
        for name, p in model.named_parameters():  # NOTE: a tied head is the embedding's tensor
            data = torch.empty(p.shape, device=device, dtype=dtype)
            if "norm" in name:
                data.normal_(0.0, 0.1, generator=gen).add_(1.0)
            else:
                std = 1.0 if "embed" in name and lookup_only else p.shape[-1] ** -0.5
                data.normal_(0.0, std, generator=gen)
            p.data = data
    model.inv_freq = model.inv_freq.to(device)  # NOTE: RoPE angles stay float32 in any dtype
    return model.eval()


def step_read_bytes(model: nn.Module) -> int:
    """Weight bytes one decode step reads: every parameter but the embedding table, of which a
    step reads only its ``bs`` rows (negligible: 8 KB a row at hidden 4096). A head tied to the
    embedding is read whole (counted under its own name: duplicates are not removed)."""
    params = model.named_parameters(remove_duplicate=False)
    return sum(p.numel() * p.element_size() for n, p in params if "embed" not in n)


def weight_bytes(model: nn.Module) -> int:
    """Bytes of every parameter (embedding included)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def hf_config(cfg: Any, max_positions: int, tied: bool = False) -> Any:
    """transformers' ``LlamaConfig`` of a graphrt Llama config ``cfg`` (a preset's or a loaded
    checkpoint's), SDPA attention, the head tied to the embedding when ``tied``."""
    from transformers import LlamaConfig as HFLlamaConfig

    return HFLlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        rms_norm_eps=cfg.rms_eps,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        max_position_embeddings=max_positions,
        tie_word_embeddings=tied,
        attention_bias=False,
        mlp_bias=False,
        attn_implementation="sdpa",
    )


def checkpoint_twin(model: Any) -> Any:
    """A transformers ``LlamaForCausalLM`` holding a copy of a loaded checkpoint's weights (a
    :class:`~graphrt.models.CausalLM`, renamed back to transformers' names: ``checkpoint.slots``)."""
    import transformers

    from graphrt.checkpoints.checkpoint import slots

    cfg = model.cfg
    config = hf_config(cfg, cfg.max_position_embeddings, tied=cfg.tie_word_embeddings)
    twin = transformers.LlamaForCausalLM(config).eval()
    params = dict(model.named_parameters())
    state = {name: s.view(params[s.param]) for name, s in slots(model).items()}
    missing, unexpected = twin.load_state_dict(state, strict=False)
    if unexpected or not set(missing) <= {"lm_head.weight"}:
        raise RuntimeError(f"the twin's tensors differ: missing {missing}, unexpected {unexpected}")
    return twin


def _share(module: nn.Module, name: str, tensor: torch.Tensor) -> None:
    module._parameters[name] = nn.Parameter(tensor, requires_grad=False)


def hf_twin(model: TinyLlama, max_positions: int) -> Any:
    """``LlamaForCausalLM`` whose parameters are views of ``model``'s (built on the meta device,
    so no weight is allocated twice); its RoPE buffers are computed on ``model``'s device."""
    from transformers import LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg, device = model.cfg, model.inv_freq.device
    config = hf_config(cfg, max_positions, tied=cfg.tie_word_embeddings)
    with torch.device("meta"):
        hf = LlamaForCausalLM(config)
    q, kv, inner = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.intermediate_size
    for ours, theirs in zip(model.layers, hf.model.layers, strict=True):
        attn, mlp = theirs.self_attn, theirs.mlp
        qkv = ours.attn.qkv.weight.split((q, kv, kv))
        for proj, rows in zip((attn.q_proj, attn.k_proj, attn.v_proj), qkv, strict=True):
            _share(proj, "weight", rows)
        _share(attn.o_proj, "weight", ours.attn.o.weight)
        gate, up = ours.mlp.gate_up.weight.split((inner, inner))
        _share(mlp.gate_proj, "weight", gate)
        _share(mlp.up_proj, "weight", up)
        _share(mlp.down_proj, "weight", ours.mlp.down.weight)
        _share(theirs.input_layernorm, "weight", ours.attn_norm.weight)
        _share(theirs.post_attention_layernorm, "weight", ours.mlp_norm.weight)
    _share(hf.model.embed_tokens, "weight", model.embed.weight)
    _share(hf.model.norm, "weight", model.norm.weight)
    _share(hf.lm_head, "weight", model.lm_head.weight)
    hf.model.rotary_emb = LlamaRotaryEmbedding(config).to(device)
    left = [n for n, t in [*hf.named_parameters(), *hf.named_buffers()] if t.is_meta]
    if left:  # NOTE: a transformers version with a tensor this mapping does not know
        raise RuntimeError(f"transformers' Llama has tensors graphrt does not map: {', '.join(left)}")
    return hf.eval()


@dataclass(frozen=True, slots=True)
class Parity:
    """How one decode step's logits of two implementations compare (``b`` is the reference)."""

    rel_l2: float
    max_abs: float
    top1_agree: float
    tolerance: float
    passed: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype, tol: float | None = None) -> Parity:
    """``a`` against ``b`` (``[bs, vocab]``, any float dtype) within ``tol`` (default: the model
    ``dtype``'s :data:`PARITY_TOLERANCE`)."""
    a, b = a.float().reshape(b.shape[0], -1), b.float().reshape(b.shape[0], -1)
    rel = ((a - b).norm() / b.norm().clamp_min(1e-30)).item()
    tol = PARITY_TOLERANCE[dtype] if tol is None else tol
    return Parity(
        rel_l2=rel,
        max_abs=(a - b).abs().max().item(),
        top1_agree=(a.argmax(-1) == b.argmax(-1)).float().mean().item(),
        tolerance=tol,
        passed=bool(torch.isfinite(a).all().item()) and rel <= tol,
    )


def require(parity: Parity, what: str) -> None:
    """Raise :class:`ParityError` naming ``what`` and the numbers when ``parity`` failed."""
    if not parity.passed:
        raise ParityError(
            f"{what}: logits differ (relative L2 error {parity.rel_l2:.3g} > tolerance "
            f"{parity.tolerance:g}, max |diff| {parity.max_abs:.3g}, top-1 agreement "
            f"{parity.top1_agree:.0%}); not timing two different computations"
        )

"""Run an unmodified ``transformers`` causal LM under graphrt: attention through ``ctx``.

transformers looks up each attention layer's function in its ``AttentionInterface`` registry by
``config._attn_implementation``. :func:`wrap` registers :func:`graphrt_attention` there as
``"graphrt"`` and switches the model to it; the wrapper's forward then calls the model with
``input_ids[None]``, ``position_ids=positions[None]`` (graphrt's static buffers),
``use_cache=False`` and graphrt's ``ctx`` as the keyword :data:`CTX_KWARG`, which transformers
hands down untouched through every decoder layer to the attention function. That function
writes K/V into graphrt's paged cache and attends there (``ctx.attention``).

Why it captures: with a custom attention name transformers builds no mask (``create_causal_mask``
returns ``None`` for implementations it has no mask function for), rotary embeddings are tensor
ops on ``position_ids``, and no cache object is created; everything per-step is read from the
tensors graphrt owns. What a model must not do is listed by :func:`check_capturable`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from graphrt.attention.context import ForwardContext

#: The name under which graphrt's attention function is registered with transformers.
ATTENTION_NAME = "graphrt"
#: The forward keyword that carries graphrt's ``ctx`` down to the attention function.
CTX_KWARG = "graphrt_ctx"
#: Rope types that read the batch's largest position on the host (``dynamic_rope_update``).
UNCAPTURABLE_ROPE = ("dynamic", "longrope")
#: Attention keywords some models pass that graphrt's kernels do not implement (refused when set).
UNSUPPORTED_KWARGS = ("softcap",)


@dataclass(frozen=True, slots=True)
class KVGeometry:
    """What a KV cache and runtime are built from (the fields :func:`~graphrt.engine.stack.stack_for` reads)."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int


def graphrt_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention contract on graphrt's paged KV cache.

    ``query [1, num_q_heads, T, head_dim]``, ``key``/``value [1, num_kv_heads, T, head_dim]``
    (RoPE applied) → ``([1, T, num_q_heads, head_dim], None)``. The keys a token sees are those
    of its request in the paged cache (causal), so ``attention_mask`` must be ``None``.
    ``sliding_window`` (transformers: a query sees ``w`` keys, itself included) becomes graphrt's
    ``window = w - 1``; ``s_aux`` (gpt-oss's per-head sink logits) graphrt's ``sinks``.
    """
    ctx = kwargs.get(CTX_KWARG)
    if ctx is None:
        raise RuntimeError(
            f"attention implementation {ATTENTION_NAME!r} needs graphrt's ctx: call the model through "
            "graphrt.hf.wrap(model)(input_ids, positions, ctx)"
        )
    _refuse_unsupported(module.layer_idx, attention_mask, dropout, kwargs)
    q, k, v = (t[0].transpose(0, 1).contiguous() for t in (query, key, value))
    head_dim = q.shape[-1]
    if scaling is not None and scaling != head_dim**-0.5:
        # NOTE: ctx.attention scales by head_dim ** -0.5; a model constant, folded into q.
        q = q * (scaling * head_dim**0.5)
    window = None if sliding_window is None else int(sliding_window) - 1
    # NOTE: gpt-oss passes its per-head sink logits as s_aux.
    sinks = kwargs.get("s_aux", kwargs.get("sinks"))
    out = ctx.attention(module.layer_idx, q, k, v, window=window, sinks=sinks)
    return out[None], None


def _refuse_unsupported(
    layer: int, attention_mask: torch.Tensor | None, dropout: float, kwargs: dict[str, Any]
) -> None:
    """Raise ``ValueError`` for an attention call graphrt would silently get wrong (Python checks only)."""
    if attention_mask is not None:
        raise ValueError(
            f"layer {layer}: the model built an attention mask; graphrt attends causally "
            "over the paged KV cache and cannot apply it"
        )
    if dropout:
        raise ValueError(f"layer {layer}: attention dropout {dropout} (put the model in eval mode)")
    unsupported = [name for name in UNSUPPORTED_KWARGS if kwargs.get(name) is not None]
    if kwargs.get("is_causal") is False:
        unsupported.append("is_causal=False")
    if unsupported:
        raise ValueError(f"layer {layer}: graphrt attention does not implement {', '.join(unsupported)}")


def register() -> None:
    """Register :func:`graphrt_attention` as ``"graphrt"`` with transformers (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, graphrt_attention)


def _rope_types(config: Any) -> set[str]:
    """Every rope type the config names (transformers 5 ``rope_parameters``, flat or per layer type)."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    nested = [p for p in params.values() if isinstance(p, dict)] if isinstance(params, dict) else []
    found = {
        str(p.get("rope_type", p.get("type", "default"))) for p in [params, *nested] if isinstance(p, dict)
    }
    return found or {"default"}


def check_capturable(model: nn.Module) -> None:
    """Raise ``ValueError`` naming what would stop ``model``'s forward from being captured.

    Refused: rope types that compare the batch's largest position to a Python int
    (``dynamic``, ``longrope``), an encoder (non-causal attention) and a model without attention
    layers that carry a ``layer_idx``. Extra outputs (attentions, hidden states) need no check:
    the wrapper's forward turns them off whatever the config says.
    """
    config = model.config
    bad = sorted(_rope_types(config) & set(UNCAPTURABLE_ROPE))
    if bad:
        raise ValueError(
            f"rope type {bad[0]!r} cannot be captured: it rescales from each batch's largest "
            "position on the host (torch.max(position_ids) compared to a Python int)"
        )
    layers = _attention_layers(model)
    if not layers:
        raise ValueError(f"{type(model).__name__}: no attention layer with a layer_idx found")
    for name, layer in layers:
        if not getattr(layer, "is_causal", True):
            raise ValueError(f"{name}: non-causal attention (an encoder) is not supported")


def _attention_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [
        (name, m)
        for name, m in model.named_modules()
        if hasattr(m, "layer_idx") and hasattr(m, "head_dim") and hasattr(m, "num_key_value_groups")
    ]


def kv_geometry(model: nn.Module) -> KVGeometry:
    """Layers, KV heads and head size of ``model``'s attention, and its vocabulary size."""
    config = model.config
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return KVGeometry(
        num_layers=config.num_hidden_layers,
        num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        vocab_size=config.vocab_size,
    )


class HFWrapped(nn.Module):
    """A transformers causal LM as ``forward(input_ids [T] int64, positions [T] int64, ctx) -> [T, vocab] fp32``.

    ``cfg`` (:class:`KVGeometry`) and ``vocab_size`` say how to build its KV cache and runtime.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.hf = model
        self.cfg = kv_geometry(model)
        self.vocab_size = self.cfg.vocab_size

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        out = self.hf(
            input_ids=input_ids[None],
            position_ids=positions[None],
            use_cache=False,  # NOTE: no cache argument: transformers 5.24 renamed past_key_values
            output_attentions=False,
            output_hidden_states=False,
            return_dict=True,
            # NOTE: only the rows a sampling step samples from (None: transformers' default 0, all)
            **({} if ctx.head_rows is None else {"logits_to_keep": ctx.head_rows}),
            **{CTX_KWARG: ctx},
        )
        return out.logits[0].float()


def wrap(model: nn.Module) -> HFWrapped:
    """Make a transformers ``PreTrainedModel`` (a causal LM) run under :class:`~graphrt.GraphRuntime`.

    Registers graphrt's attention with transformers, switches ``model`` to it
    (``set_attn_implementation("graphrt")``) and puts it in eval mode; both change ``model``
    itself. Raises ``ValueError`` (:func:`check_capturable`) before touching it when its
    forward cannot be captured.

    Returns
    -------
    HFWrapped
        ``forward(input_ids [T] int64, positions [T] int64, ctx) -> logits [T, vocab] fp32``.
    """
    check_capturable(model)
    register()
    model.set_attn_implementation(ATTENTION_NAME)
    model.eval()
    return HFWrapped(model)

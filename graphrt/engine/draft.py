"""The draft model's stack for speculative decoding: a preset or a checkpoint, checked against the target."""

from __future__ import annotations

import dataclasses

import torch

from graphrt.engine.speculative import SpecOptions
from graphrt.engine.stack import ModelStack, build_stack
from graphrt.kv import PagedKVCache
from graphrt.kv.quant import is_fp8
from graphrt.models.presets import PRESETS, DSAConfig
from graphrt.parallel import TPGroup
from graphrt.step.config import RuntimeConfig
from graphrt.step.limits import model_vocab_size
from graphrt.step.modes import ForwardMode


def draft_init(spec: SpecOptions) -> str:
    """``spec.draft_init``, defaulted: a preset copies the target, a checkpoint keeps its weights."""
    if spec.draft_init is not None:
        return spec.draft_init
    return "target" if spec.draft_model in PRESETS else "checkpoint"


def build_draft(
    spec: SpecOptions,
    target: torch.nn.Module,
    target_kv: object,
    config: RuntimeConfig,
    device: torch.device,
    *,
    use_graphs: bool,
    tp: TPGroup,
    show_progress: bool = False,
) -> ModelStack:
    """The draft's stack (same pages and request rows as the target's), weights set, graphs captured.

    Raises ``ValueError`` when the draft's vocabulary differs from the target's (a draft token
    must mean the same thing to both), for a tree draft under tensor parallelism (the host
    moves the accepted path's KV on one rank), or for a ``draft_init`` its model cannot take.
    """
    if spec.geometry.topk > 1 and tp.size > 1:
        raise ValueError(
            f"tree drafts (topk {spec.geometry.topk}) run without tensor parallelism (tp {tp.size})"
        )
    init, preset_draft = draft_init(spec), spec.draft_model in PRESETS
    if init == "checkpoint" and preset_draft:
        raise ValueError(f"draft_init 'checkpoint' needs a checkpoint draft; {spec.draft_model} is a preset")
    if init == "seed" and not preset_draft:
        raise ValueError(f"draft_init 'seed' applies to preset drafts; {spec.draft_model} is a checkpoint")
    modes = (ForwardMode.DRAFT_EXTEND,) + (
        (ForwardMode.DRAFT_DECODE,) if spec.geometry.draft_forwards else ()
    )
    # NOTE: drafts are the draft's argmax (a deterministic proposal): it never samples.
    draft_config = dataclasses.replace(config, capture_modes=modes if use_graphs else (), sample=False)
    # NOTE: a DSA draft keeps a DSA target's MLA layout (BF16 or FP8-656), an MHA draft an
    # MHA target's FP8 cache.
    dsa = preset_draft and isinstance(PRESETS[spec.draft_model], DSAConfig)
    fp8 = isinstance(target_kv, PagedKVCache) and is_fp8(target_kv.dtype)
    draft = build_stack(
        spec.draft_model,
        device,
        draft_config,
        seed=spec.draft_seed,
        kv_cache_dtype=getattr(target_kv, "layout", None) if dsa else ("fp8_e4m3" if fp8 else None),
        dtype=next(target.parameters()).dtype,
        tp=tp,
    )
    check_vocab(target, draft.model, spec.draft_model)
    if init == "target":
        copy_weights(target, draft.model, spec.draft_model)
    if use_graphs:
        draft.runtime.capture(show_progress)
    return draft


def check_vocab(target: torch.nn.Module, draft: torch.nn.Module, name: str) -> None:
    """Refuse a draft whose token ids mean other tokens than the target's."""
    mine, theirs = model_vocab_size(target), model_vocab_size(draft)
    if mine != theirs:
        raise ValueError(
            f"draft model {name} has a vocabulary of {theirs} tokens, the target {mine}: "
            "speculative decoding needs one vocabulary (the same tokenizer)"
        )


def copy_weights(target: torch.nn.Module, draft: torch.nn.Module, name: str) -> None:
    """Give ``draft`` the target's weights by name (self-speculative early exit, or a copy).

    A shallower draft of the same width becomes the target's first layers plus its head.
    """
    own = dict(target.named_parameters())
    with torch.no_grad():
        for key, p in draft.named_parameters():
            if key not in own or own[key].shape != p.shape:
                raise ValueError(
                    f"draft_init 'target': draft {name} has parameter {key} {tuple(p.shape)}, the target "
                    f"{'none' if key not in own else tuple(own[key].shape)}; use draft_init 'seed'"
                )
            p.copy_(own[key])

"""One builder for a built-in model with its KV cache, request table and runtime."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from graphrt.engine.speculative import SpecOptions
from graphrt.kv import KVShape, PagedKVCache, ReqToToken
from graphrt.kv.mla import MLAKVCache, MLAShape
from graphrt.metadata.local import with_model_chunk
from graphrt.models.causal_lm import CausalLM
from graphrt.models.dsa import TinyDSA
from graphrt.models.hf_wrap import HFWrapped
from graphrt.models.llama import TinyLlama
from graphrt.models.loader import default_dtype, load, resolve
from graphrt.models.parallel import SINGLE
from graphrt.models.presets import PRESETS, DSAConfig, preset
from graphrt.parallel import TPGroup
from graphrt.runtime import GraphRuntime
from graphrt.step.config import RuntimeConfig
from graphrt.step.modes import ForwardMode


@dataclass(frozen=True, slots=True)
class ModelStack:
    model: TinyLlama | TinyDSA | CausalLM | HFWrapped
    kv: PagedKVCache | MLAKVCache
    req_to_token: ReqToToken
    runtime: GraphRuntime


def build_stack(
    name: str,
    device: torch.device,
    config: RuntimeConfig,
    *,
    max_reqs: int | None = None,
    seed: int = 0,
    kv_cache_dtype: str | None = None,
    dtype: torch.dtype | None = None,
    tp: TPGroup = SINGLE,
) -> ModelStack:
    """Preset ``name`` with random weights from ``seed``, or a checkpoint (``graphrt.models.load``).

    ``name``: a preset, a checkpoint directory, a ``.gguf`` file or ``"smollm2"``. ``dtype``
    defaults to bf16 on CUDA, fp32 elsewhere.

    The KV cache holds ``max_reqs`` (default ``max_batch_size``) full-context requests plus the
    dummy page, so request row ``i`` can own pages ``i * max_pages ...``. ``kv_cache_dtype``:
    ``"bf16"`` (default) or ``"fp8"`` (656 bytes/token) for DSA presets; MHA presets keep
    the model's dtype. ``tp``: this rank's shards of the same model; its KV cache holds the
    rank's KV heads only.
    """
    dtype = dtype or default_dtype(device)
    checkpoint = None if name in PRESETS else resolve(name)
    if checkpoint is not None:
        if tp.size > 1:
            raise ValueError(
                f"tensor parallelism (tp {tp.size}) runs the built-in presets; {name} is a checkpoint"
            )
        if kv_cache_dtype not in (None, "auto"):
            raise ValueError(f"kv_cache_dtype {kv_cache_dtype!r} applies to DSA presets only")
        return stack_for(load(checkpoint, device=device, dtype=dtype), config, max_reqs=max_reqs)
    cfg = preset(name)
    config = with_model_chunk(config, getattr(cfg, "attention_chunk_size", None))
    max_reqs = max_reqs or config.max_batch_size
    num_pages = max_reqs * config.max_pages + 1
    if isinstance(cfg, DSAConfig):
        if tp.size > 1:
            raise ValueError(f"tensor parallelism supports the Llama presets; {name} is a DSA model")
        model = TinyDSA.from_seed(cfg, seed, device, dtype)
        mla = MLAShape(
            cfg.num_layers, config.page_size, num_pages, cfg.index_dim, cfg.index_topk, cfg.num_heads
        )
        kv = MLAKVCache(mla, kv_cache_dtype or "bf16", dtype, device)
    else:
        if kv_cache_dtype not in (None, "auto"):
            raise ValueError(f"kv_cache_dtype {kv_cache_dtype!r} applies to DSA presets only")
        model = TinyLlama.from_seed(cfg, seed, device, dtype, tp)
        shape = KVShape(cfg.num_layers, model.num_kv_heads, cfg.head_dim, config.page_size, num_pages)
        kv = PagedKVCache(shape, dtype, device)
    req_to_token = ReqToToken(max_reqs, config.max_context_len, config.page_size, kv.dummy_slot, device)
    runtime = GraphRuntime(model, kv, req_to_token, config, vocab_size=cfg.vocab_size)
    return ModelStack(model, kv, req_to_token, runtime)


def stack_for(
    model: CausalLM | HFWrapped, config: RuntimeConfig, *, max_reqs: int | None = None
) -> ModelStack:
    """A paged KV cache (``max_reqs`` full-context requests + the dummy page) and runtime for ``model``.

    The cache takes the model's parameter dtype and device and ``model.cfg``'s geometry
    (``num_layers``, ``num_kv_heads``, ``head_dim``, ``vocab_size``).
    """
    cfg, param = model.cfg, next(model.parameters())
    max_reqs = max_reqs or config.max_batch_size
    shape = KVShape(
        cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, config.page_size, max_reqs * config.max_pages + 1
    )
    kv = PagedKVCache(shape, param.dtype, param.device)
    req_to_token = ReqToToken(max_reqs, config.max_context_len, config.page_size, kv.dummy_slot, param.device)
    return ModelStack(
        model, kv, req_to_token, GraphRuntime(model, kv, req_to_token, config, vocab_size=cfg.vocab_size)
    )


def build_draft(
    spec: SpecOptions,
    target: torch.nn.Module,
    target_kv: PagedKVCache | MLAKVCache,
    device: torch.device,
    config: RuntimeConfig,
    use_graphs: bool,
    tp: TPGroup = SINGLE,
) -> ModelStack:
    """The draft model's stack (same pages and request rows as the target's), not captured.

    Its runtime captures DRAFT_EXTEND (and DRAFT_DECODE when the draft runs forwards) when
    ``use_graphs``. ``draft_init="target"`` copies the target's weights by name.
    """
    modes = (ForwardMode.DRAFT_EXTEND,) + (
        (ForwardMode.DRAFT_DECODE,) if spec.geometry.draft_forwards else ()
    )
    draft_config = dataclasses.replace(config, capture_modes=modes if use_graphs else ())
    # NOTE: a DSA draft keeps a DSA target's MLA layout (BF16 or FP8-656).
    dsa_draft = isinstance(preset(spec.draft_model), DSAConfig)
    layout = getattr(target_kv, "layout", None) if dsa_draft else None
    draft = build_stack(
        spec.draft_model, device, draft_config, seed=spec.draft_seed, kv_cache_dtype=layout, tp=tp
    )
    if spec.draft_init == "target":
        # NOTE: a shallower preset of the same width becomes the target's first layers plus
        # its head (self-speculative early exit); the same preset becomes a copy.
        own = dict(target.named_parameters())
        with torch.no_grad():
            for name, p in draft.model.named_parameters():
                p.copy_(own[name])
    return draft

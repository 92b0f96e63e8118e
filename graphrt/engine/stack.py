"""One builder for a built-in model with its KV cache, request table and runtime."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from graphrt.kv import KVShape, LatentKVCache, LatentShape, PagedKVCache, ReqToToken
from graphrt.kv.mla import MLAKVCache, MLAShape
from graphrt.metadata.local import with_model_chunk
from graphrt.models.causal_lm import CausalLM
from graphrt.models.dsa import TinyDSA
from graphrt.models.hf_wrap import HFWrapped
from graphrt.models.llama import TinyLlama
from graphrt.models.loader import default_dtype, load, resolve
from graphrt.models.mla import MLACausalLM
from graphrt.models.parallel import SINGLE
from graphrt.models.presets import PRESETS, DSAConfig, LlamaConfig, MLAConfig, preset
from graphrt.parallel import TPGroup
from graphrt.runtime import GraphRuntime
from graphrt.step.config import RuntimeConfig


@dataclass(frozen=True, slots=True)
class ModelStack:
    model: TinyLlama | TinyDSA | CausalLM | MLACausalLM | HFWrapped
    kv: PagedKVCache | LatentKVCache | MLAKVCache
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
    ``"bf16"`` (default) or ``"fp8"`` (656 bytes/token) for DSA presets; MHA and dense-MLA
    models keep the model's dtype. ``tp``: this rank's shards of the same model (a preset's or a
    checkpoint's); its KV cache holds the rank's KV heads only.
    """
    dtype = dtype or default_dtype(device)
    checkpoint = None if name in PRESETS else resolve(name)
    cfg = preset(name) if checkpoint is None else None
    if kv_cache_dtype not in (None, "auto") and not isinstance(cfg, DSAConfig):
        raise ValueError(f"kv_cache_dtype {kv_cache_dtype!r} applies to DSA presets only")
    if cfg is None:
        return stack_for(load(name, device=device, dtype=dtype, tp=tp), config, max_reqs=max_reqs)
    config = with_model_chunk(config, getattr(cfg, "attention_chunk_size", None))
    max_reqs = max_reqs or config.max_batch_size
    num_pages = max_reqs * config.max_pages + 1
    model, kv = _preset_parts(name, cfg, config.page_size, num_pages, seed, dtype, device, tp, kv_cache_dtype)
    req_to_token = ReqToToken(max_reqs, config.max_context_len, config.page_size, kv.dummy_slot, device)
    runtime = GraphRuntime(model, kv, req_to_token, config, vocab_size=cfg.vocab_size)
    return ModelStack(model, kv, req_to_token, runtime)


def _preset_parts(
    name: str,
    cfg: LlamaConfig | DSAConfig | MLAConfig,
    page_size: int,
    num_pages: int,
    seed: int,
    dtype: torch.dtype,
    device: torch.device,
    tp: TPGroup,
    kv_cache_dtype: str | None,
) -> tuple[TinyLlama | TinyDSA | MLACausalLM, PagedKVCache | LatentKVCache | MLAKVCache]:
    """A preset's model (random weights from ``seed``) and its KV cache of ``num_pages``."""
    if isinstance(cfg, MLAConfig):
        return MLACausalLM.from_seed(cfg, seed, device, dtype, tp), latent_cache(
            cfg, page_size, num_pages, dtype, device
        )
    if isinstance(cfg, DSAConfig):
        if tp.size > 1:
            raise ValueError(f"tensor parallelism supports the Llama presets; {name} is a DSA model")
        mla = MLAShape(cfg.num_layers, page_size, num_pages, cfg.index_dim, cfg.index_topk, cfg.num_heads)
        return TinyDSA.from_seed(cfg, seed, device, dtype), MLAKVCache(
            mla, kv_cache_dtype or "bf16", dtype, device
        )
    model = TinyLlama.from_seed(cfg, seed, device, dtype, tp)
    shape = KVShape(cfg.num_layers, model.num_kv_heads, cfg.head_dim, page_size, num_pages)
    return model, PagedKVCache(shape, dtype, device)


def latent_cache(
    cfg: MLAConfig, page_size: int, num_pages: int, dtype: torch.dtype, device: torch.device
) -> LatentKVCache:
    """The dense-MLA cache of ``cfg``: its layers' latents and RoPE keys over ``num_pages``."""
    shape = LatentShape(cfg.num_layers, cfg.kv_lora_rank, cfg.qk_rope_head_dim, page_size, num_pages)
    return LatentKVCache(shape, dtype, device)


def stack_for(
    model: CausalLM | MLACausalLM | HFWrapped, config: RuntimeConfig, *, max_reqs: int | None = None
) -> ModelStack:
    """A KV cache (``max_reqs`` full-context requests + the dummy page) and runtime for ``model``.

    The cache takes the model's parameter dtype and device and ``model.cfg``'s geometry: a
    latent cache for a dense-MLA model, else a paged cache (``num_layers``, ``head_dim``) whose
    KV heads are the ones this rank stores (``model.num_kv_heads`` of a tensor-parallel shard,
    else ``cfg.num_kv_heads``).
    """
    cfg, param = model.cfg, next(model.parameters())
    max_reqs = max_reqs or config.max_batch_size
    num_pages = max_reqs * config.max_pages + 1
    kv: PagedKVCache | LatentKVCache
    if isinstance(cfg, MLAConfig):
        kv = latent_cache(cfg, config.page_size, num_pages, param.dtype, param.device)
    else:
        heads = getattr(model, "num_kv_heads", cfg.num_kv_heads)
        kv = PagedKVCache(
            KVShape(cfg.num_layers, heads, cfg.head_dim, config.page_size, num_pages),
            param.dtype,
            param.device,
        )
    req_to_token = ReqToToken(max_reqs, config.max_context_len, config.page_size, kv.dummy_slot, param.device)
    return ModelStack(
        model, kv, req_to_token, GraphRuntime(model, kv, req_to_token, config, vocab_size=cfg.vocab_size)
    )

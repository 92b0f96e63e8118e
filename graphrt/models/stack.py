"""One builder for a built-in model with its KV cache, request table and runtime."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from graphrt.config import RuntimeConfig
from graphrt.kv_cache import KVShape, PagedKVCache, ReqToToken
from graphrt.local_attention import with_model_chunk
from graphrt.models.llama import TinyLlama
from graphrt.models.presets import preset
from graphrt.runtime import GraphRuntime


@dataclass(frozen=True, slots=True)
class ModelStack:
    model: TinyLlama
    kv: PagedKVCache
    req_to_token: ReqToToken
    runtime: GraphRuntime


def build_stack(
    name: str, device: torch.device, config: RuntimeConfig, *, max_reqs: int | None = None, seed: int = 0
) -> ModelStack:
    """Preset ``name`` with random weights from ``seed``; bf16 on CUDA, fp32 elsewhere.

    The KV cache holds ``max_reqs`` (default ``max_batch_size``) full-context requests plus the
    dummy page, so request row ``i`` can own pages ``i * max_pages ...``.
    """
    cfg = preset(name)
    config = with_model_chunk(config, cfg.attention_chunk_size)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = TinyLlama.from_seed(cfg, seed, device, dtype)
    max_reqs = max_reqs or config.max_batch_size
    num_pages = max_reqs * config.max_pages + 1
    shape = KVShape(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, config.page_size, num_pages)
    kv = PagedKVCache(shape, dtype, device)
    r2t = ReqToToken(max_reqs, config.max_context_len, config.page_size, kv.dummy_slot, device)
    runtime = GraphRuntime(model, kv, r2t, config, vocab_size=cfg.vocab_size)
    return ModelStack(model, kv, r2t, runtime)

"""One builder for a built-in model with its KV cache, request table and runtime."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from graphrt.checkpoints.loader import default_dtype, load, resolve
from graphrt.engine.graphable import graphable, without_mixed
from graphrt.kv import EncoderKV, KVShape, LatentKVCache, LatentShape, PagedKVCache, ReqToToken
from graphrt.kv.mla import LAYOUTS, PLAIN_LAYOUTS, MLAKVCache, MLAShape
from graphrt.kv.quant import MHA_KV_DTYPES, KVScales
from graphrt.kv.window import WindowLayers, window_pool_pages, window_step
from graphrt.metadata.local import with_model_chunk
from graphrt.models.causal_lm import CausalLM
from graphrt.models.cross import CrossDecoder
from graphrt.models.dsa import TinyDSA
from graphrt.models.hf_wrap import HFWrapped
from graphrt.models.indexed_mla import mla_decoder
from graphrt.models.llama import TinyLlama
from graphrt.models.mla import MLACausalLM
from graphrt.models.parallel import SINGLE
from graphrt.models.presets import PRESETS, CrossConfig, DSAConfig, MLAConfig, preset
from graphrt.models.quantize import check_quantization, quantize
from graphrt.parallel import TPGroup
from graphrt.runtime import GraphRuntime
from graphrt.step.config import RuntimeConfig


@dataclass(frozen=True, slots=True)
class ModelStack:
    """A model, its KV cache, request table and runtime; ``encoder``: an encoder-decoder
    model's encoder cache (``model.encode_into(encoder, row, encoder_ids)`` fills a row)."""

    model: TinyLlama | TinyDSA | CausalLM | MLACausalLM | HFWrapped | CrossDecoder
    kv: PagedKVCache | LatentKVCache | MLAKVCache
    req_to_token: ReqToToken
    runtime: GraphRuntime
    encoder: EncoderKV | None = None


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
    progress: Callable[[int, int], None] | None = None,
    window_pool: bool = False,
    quantization: str | None = None,
    optional_mixed: bool = False,
) -> ModelStack:
    """Preset ``name`` with random weights from ``seed``, or a checkpoint (``graphrt.checkpoints.load``).

    ``name``: a preset, a checkpoint directory, a ``.gguf`` file or ``"smollm2"``. ``dtype``
    defaults to bf16 on CUDA, fp32 elsewhere.

    The KV cache holds ``max_reqs`` (default ``max_batch_size``) full-context requests plus the
    dummy page, so request row ``i`` can own pages ``i * max_pages ...``. ``kv_cache_dtype``:
    ``"bf16"`` (default) or ``"fp8"`` (656 bytes/token) for DSA presets; for MHA/GQA models
    ``"auto"`` (default: the model's dtype) or ``"fp8_e4m3"`` (one byte per element, per-layer
    scales from the checkpoint or 1.0; :mod:`graphrt.kv.quant`); dense-MLA models keep the
    model's dtype. ``tp``: this rank's shards of the same model (a preset's or a checkpoint's);
    its KV cache holds the rank's KV heads only.
    ``progress(done, total)``: called after each checkpoint tensor is read. ``window_pool``:
    sliding-window layers keep their KV in a pool of ``window + step`` positions per request
    (:mod:`graphrt.kv.window`, :func:`window_layers`) instead of the full context.
    ``quantization``: ``"fp8"`` quantizes the model's projections once built
    (:func:`graphrt.models.quantize.quantize`). ``optional_mixed``: drop ``config``'s MIXED
    where the model cannot graph it (:mod:`.graphable`) instead of refusing the model.
    """
    dtype = dtype or default_dtype(device)
    check_quantization(quantization)
    checkpoint = None if name in PRESETS else resolve(name)
    if checkpoint is not None:
        model = load(
            checkpoint, device=device, dtype=dtype, tp=tp, progress=progress, quantization=quantization
        )
        layout: dict[str, Any] = {"kv_cache_dtype": kv_cache_dtype, "window_pool": window_pool}
        return stack_for(model, config, max_reqs=max_reqs, optional_mixed=optional_mixed, **layout)
    cfg = preset(name)
    if isinstance(cfg, CrossConfig):
        if quantization is not None:
            raise ValueError(
                f"quantization {quantization!r} is not supported for encoder-decoder presets ({name})"
            )
        config = without_mixed(config) if optional_mixed else config
        return cross_stack(
            cfg, device, config, max_reqs or config.max_batch_size, seed, dtype, kv_cache_dtype, tp
        )
    options = PresetOptions(seed, device, dtype, kv_cache_dtype, tp, window_pool)
    return preset_stack(name, cfg, config, max_reqs, options, quantization, optional_mixed)


def preset_stack(
    name: str,
    cfg: Any,
    config: RuntimeConfig,
    max_reqs: int | None,
    o: PresetOptions,
    quantization: str | None,
    optional_mixed: bool,
) -> ModelStack:
    """A decoder-only preset's stack (:func:`build_stack`'s arguments)."""
    config = with_model_chunk(config, getattr(cfg, "attention_chunk_size", None))
    max_reqs = max_reqs or config.max_batch_size
    model, kv = preset_model_kv(name, cfg, config, max_reqs, o)
    quantize(model, quantization)
    req_to_token = ReqToToken(max_reqs, config.max_context_len, config.page_size, kv.dummy_slot, o.device)
    config = graphable(config, kv, model) if optional_mixed else config
    runtime = GraphRuntime(model, kv, req_to_token, config, vocab_size=cfg.vocab_size)
    return ModelStack(model, kv, req_to_token, runtime)


@dataclass(frozen=True)
class PresetOptions:
    """How :func:`build_stack` builds a preset: its seed, device, dtypes, TP group and KV layout."""

    seed: int
    device: torch.device
    dtype: torch.dtype
    kv_cache_dtype: str | None
    tp: TPGroup
    window_pool: bool


def preset_model_kv(
    name: str, cfg: Any, config: RuntimeConfig, max_reqs: int, o: PresetOptions
) -> tuple[Any, Any]:
    """A decoder-only preset's model (random weights from ``o.seed``) and its KV cache of
    ``max_reqs`` full-context requests plus the dummy page."""
    seed, device, dtype, kv_cache_dtype, tp = o.seed, o.device, o.dtype, o.kv_cache_dtype, o.tp
    num_pages = max_reqs * config.max_pages + 1
    if isinstance(cfg, MLAConfig):
        model = mla_decoder(cfg).from_seed(cfg, seed, device, dtype, tp)
        kv = latent_cache(cfg, config.page_size, num_pages, dtype, device, kv_cache_dtype)
    elif isinstance(cfg, DSAConfig):
        if tp.size > 1:
            raise ValueError(f"tensor parallelism supports the Llama presets; {name} is a DSA model")
        model = TinyDSA.from_seed(cfg, seed, device, dtype)
        mla = MLAShape(
            cfg.num_layers, config.page_size, num_pages, cfg.index_dim, cfg.index_topk, cfg.num_heads
        )
        kv = MLAKVCache(mla, "bf16" if kv_cache_dtype in (None, "auto") else kv_cache_dtype, dtype, device)
    else:
        model = TinyLlama.from_seed(cfg, seed, device, dtype, tp)
        shape = KVShape(cfg.num_layers, model.num_kv_heads, cfg.head_dim, config.page_size, num_pages)
        window = window_layers(cfg, config, max_reqs) if o.window_pool else None
        kv = PagedKVCache(shape, mha_kv_dtype(kv_cache_dtype, dtype), device, window=window)
    return model, kv


def cross_stack(
    cfg: CrossConfig,
    device: torch.device,
    config: RuntimeConfig,
    max_reqs: int,
    seed: int,
    dtype: torch.dtype,
    kv_cache_dtype: str | None = None,
    tp: TPGroup = SINGLE,
) -> ModelStack:
    """An encoder-decoder preset: the decoder's KV cache (self-attention layers), the encoder
    cache (cross layers; ``max_reqs`` rows of ``max_encoder_len`` tokens) and the runtime."""
    model = CrossDecoder.from_seed(cfg, seed, device, dtype, tp)
    kv_dtype, ps = mha_kv_dtype(kv_cache_dtype, dtype), config.page_size
    shape = KVShape(cfg.self_layers, cfg.num_kv_heads, cfg.head_dim, ps, max_reqs * config.max_pages + 1)
    kv = PagedKVCache(shape, kv_dtype, device)
    enc_pages = max_reqs * -(-cfg.max_encoder_len // ps) + 1
    enc_kv = PagedKVCache(
        KVShape(cfg.cross_layers, cfg.num_kv_heads, cfg.head_dim, ps, enc_pages), kv_dtype, device
    )
    encoder = EncoderKV(enc_kv, max_reqs, cfg.max_encoder_len)
    req_to_token = ReqToToken(max_reqs, config.max_context_len, ps, kv.dummy_slot, device)
    runtime = GraphRuntime(model, kv, req_to_token, config, vocab_size=cfg.vocab_size, encoder=encoder)
    return ModelStack(model, kv, req_to_token, runtime, encoder)


def mha_kv_dtype(name: str | None, model_dtype: torch.dtype) -> torch.dtype:
    """The dtype of an MHA/GQA cache named ``name`` (``None``/``"auto"``: ``model_dtype``)."""
    if (name or "auto") not in MHA_KV_DTYPES:
        raise ValueError(
            f"kv_cache_dtype {name!r} is not one of {', '.join(MHA_KV_DTYPES)} for an MHA/GQA model "
            "(bf16 | fp8 are DSA presets' MLA layouts)"
        )
    return MHA_KV_DTYPES[name or "auto"] or model_dtype


def latent_cache(
    cfg: MLAConfig,
    page_size: int,
    num_pages: int,
    dtype: torch.dtype,
    device: torch.device,
    kv_cache_dtype: str | None = None,
) -> LatentKVCache | MLAKVCache:
    """The MLA cache of ``cfg`` over ``num_pages``: for dense MLA each layer's latents and RoPE
    keys in ``dtype``; with a DSA indexer (DeepSeek-V3.2) the sparse-MLA cache, its latent rows
    in :func:`dsa_layout` and the indexer's keys in ``dtype``."""
    if cfg.indexer is not None:
        idx = cfg.indexer
        shape = MLAShape(cfg.num_layers, page_size, num_pages, idx.head_dim, idx.topk, cfg.num_heads)
        return MLAKVCache(shape, dsa_layout(kv_cache_dtype, dtype), dtype, device)
    if kv_cache_dtype not in (None, "auto"):
        raise ValueError(
            f"kv_cache_dtype {kv_cache_dtype!r}: a dense-MLA cache keeps the model's dtype ('auto')"
        )
    shape = LatentShape(cfg.num_layers, cfg.kv_lora_rank, cfg.qk_rope_head_dim, page_size, num_pages)
    return LatentKVCache(shape, dtype, device)


def dsa_layout(name: str | None, model_dtype: torch.dtype) -> str:
    """The layout of a sparse-MLA (DSA) cache named ``name``: one of
    :data:`~graphrt.kv.mla.LAYOUTS`; ``None`` / ``"auto"``: ``model_dtype``'s, bf16 or fp32."""
    layout = name or "auto"
    if layout == "auto":
        layout = next((n for n, d in PLAIN_LAYOUTS.items() if d == model_dtype), str(model_dtype))
    if layout not in LAYOUTS:
        raise ValueError(
            f"kv_cache_dtype {layout!r}: a sparse-MLA (DSA) cache holds one of {', '.join(LAYOUTS)} "
            "(auto: the model's dtype when it is bf16 or fp32)"
        )
    return layout


def stack_for(
    model: TinyLlama | CausalLM | MLACausalLM | HFWrapped,
    config: RuntimeConfig,
    *,
    max_reqs: int | None = None,
    kv_cache_dtype: str | None = None,
    window_pool: bool = False,
    optional_mixed: bool = False,
) -> ModelStack:
    """A KV cache (``max_reqs`` full-context requests + the dummy page) and runtime for ``model``.

    A dense-MLA model gets a :class:`LatentKVCache` (:func:`latent_cache`). Otherwise the paged
    cache takes the model's device, ``model.cfg``'s geometry (``num_layers``, ``head_dim``,
    ``vocab_size``) and the model's parameter dtype, or FP8 for ``kv_cache_dtype="fp8_e4m3"``
    (with the checkpoint's ``kv_scales`` when it had any, else 1.0); its KV heads are the ones
    this rank stores (``model.num_kv_heads`` of a tensor-parallel shard, else ``cfg.num_kv_heads``).
    ``window_pool``, ``optional_mixed``: as :func:`build_stack`.
    """
    cfg, param = model.cfg, next(model.parameters())
    max_reqs = max_reqs or config.max_batch_size
    num_pages = max_reqs * config.max_pages + 1
    kv: PagedKVCache | LatentKVCache | MLAKVCache
    if isinstance(cfg, MLAConfig):
        kv = latent_cache(cfg, config.page_size, num_pages, param.dtype, param.device, kv_cache_dtype)
    else:
        heads = getattr(model, "num_kv_heads", cfg.num_kv_heads)
        shape = KVShape(cfg.num_layers, heads, cfg.head_dim, config.page_size, num_pages)
        scales: KVScales | None = getattr(model, "kv_scales", None)
        window = window_layers(cfg, config, max_reqs) if window_pool else None
        kv = PagedKVCache(shape, mha_kv_dtype(kv_cache_dtype, param.dtype), param.device, scales, window)
    req_to_token = ReqToToken(max_reqs, config.max_context_len, config.page_size, kv.dummy_slot, param.device)
    config = graphable(config, kv, model) if optional_mixed else config
    return ModelStack(
        model, kv, req_to_token, GraphRuntime(model, kv, req_to_token, config, vocab_size=cfg.vocab_size)
    )


def window_layers(
    cfg: Any, config: RuntimeConfig, max_reqs: int, prefill_tokens: int | None = None
) -> WindowLayers:
    """The window pool of a model whose ``cfg.window(layer)`` names its sliding windows: its
    window layers, their largest window, ``window_step(config)`` positions per step, and room
    for ``prefill_tokens`` (default ``max_context_len``) prefilled at once.

    Raises ``ValueError`` when the model has no sliding-window layer.
    """
    windows = {i: cfg.window(i) for i in range(cfg.num_layers)} if hasattr(cfg, "window") else {}
    layers = frozenset(i for i, w in windows.items() if w is not None)
    if not layers:
        raise ValueError(f"window_pool: the model has no sliding-window layers ({type(cfg).__name__})")
    window, step = max(windows[i] for i in layers), window_step(config)
    prefill = config.max_context_len if prefill_tokens is None else prefill_tokens
    pages = window_pool_pages(window, step, config.page_size, max_reqs, prefill)
    return WindowLayers(window, layers, pages, step)

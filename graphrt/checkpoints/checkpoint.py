"""Where each checkpoint tensor (Hugging Face names) lands in :class:`CausalLM`, and the checks.

Names follow transformers' Llama/Qwen layout (DeepSeek-V2/V3's attention for dense-MLA models);
GGUF files are renamed to it first. Expected
shapes come from the model built on the meta device, so every check (a TP size that does not
divide the heads included) runs before any memory is allocated on the target device. With
tensor parallelism each parameter's :class:`~graphrt.models.parallel.Shard` says which rows or
columns of a checkpoint tensor this rank keeps, and the source reads only those.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Protocol

import torch

from graphrt.checkpoints.errors import CheckpointError
from graphrt.checkpoints.fp8_layers import hold_layers
from graphrt.checkpoints.moe_tensors import expert_slots
from graphrt.checkpoints.slot import Slot
from graphrt.kv.quant import KVScales
from graphrt.models.causal_lm import CausalLM
from graphrt.models.config import ModelConfig
from graphrt.models.indexed_mla import mla_decoder
from graphrt.models.mla import MLACausalLM
from graphrt.models.parallel import SINGLE, Shard, to_empty, whole
from graphrt.models.presets import MLAConfig
from graphrt.models.quantize import release_fp8, scale_shard
from graphrt.parallel import TPGroup

Shape = tuple[int, ...]

#: Checkpoint name → (graphrt parameter, part of a fused parameter or ``None``).
GLOBAL_TENSORS: dict[str, tuple[str, int | None]] = {
    "model.embed_tokens.weight": ("embed.weight", None),
    "model.norm.weight": ("norm.weight", None),
    "lm_head.weight": ("lm_head.weight", None),
}
#: Per layer ``model.layers.{i}.<key>`` → ``layers.{i}.<value>``; parts name a fused block.
LAYER_TENSORS: dict[str, tuple[str, int | None]] = {
    "input_layernorm.weight": ("attn_norm.weight", None),
    "post_attention_layernorm.weight": ("mlp_norm.weight", None),
    "self_attn.q_proj.weight": ("attn.qkv.weight", 0),
    "self_attn.k_proj.weight": ("attn.qkv.weight", 1),
    "self_attn.v_proj.weight": ("attn.qkv.weight", 2),
    "self_attn.q_proj.bias": ("attn.qkv.bias", 0),
    "self_attn.k_proj.bias": ("attn.qkv.bias", 1),
    "self_attn.v_proj.bias": ("attn.qkv.bias", 2),
    "self_attn.o_proj.weight": ("attn.o.weight", None),
    "self_attn.o_proj.bias": ("attn.o.bias", None),
    "self_attn.q_norm.weight": ("attn.q_norm.weight", None),
    "self_attn.sinks": ("attn.sinks", None),
    "self_attn.k_norm.weight": ("attn.k_norm.weight", None),
    "mlp.gate_proj.weight": ("mlp.gate_up.weight", 0),
    "mlp.up_proj.weight": ("mlp.gate_up.weight", 1),
    "mlp.down_proj.weight": ("mlp.down.weight", None),
}
#: DeepSeek-V2/V3/V3.2 attention modules: ``self_attn.<m>`` is :class:`MLACausalLM`'s ``attn.<m>``.
MLA_ATTENTION = (
    "q_proj",
    "q_a_proj",
    "q_a_layernorm",
    "q_b_proj",
    "kv_a_proj_with_mqa",
    "kv_a_layernorm",
    "kv_b_proj",
    "o_proj",
    # NOTE: DeepSeek-V3.2's DSA indexer (absent from V2/V3 models, so never expected there).
    "indexer.wq_b",
    "indexer.wk",
    "indexer.k_norm",
    "indexer.weights_proj",
)
#: Per layer for dense-MLA models: the norms and MLP as above, the attention by its own names.
MLA_LAYER_TENSORS: dict[str, tuple[str, int | None]] = {
    k: v for k, v in LAYER_TENSORS.items() if not k.startswith("self_attn.")
} | {f"self_attn.{m}.{w}": (f"attn.{m}.{w}", None) for m in MLA_ATTENTION for w in ("weight", "bias")}
#: Optional per layer ``model.layers.{i}.<key>``: an FP8 KV cache's dequantisation scales (one
#: value each; Hugging Face FP8 checkpoints), K's, V's, or one for both (older files).
KV_SCALE_TENSORS: dict[str, tuple[str, ...]] = {
    "self_attn.k_scale": ("k",),
    "self_attn.v_scale": ("v",),
    "self_attn.kv_scale": ("k", "v"),
}
#: Checkpoint names that may be present and are not loaded (RoPE tables are recomputed).
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class TensorSource(Protocol):
    """A checkpoint's config and tensors under Hugging Face names."""

    config: ModelConfig | MLAConfig
    #: GGUF ``rope_freqs`` (llama3 scaling baked into the file), else ``None``.
    freq_factors: torch.Tensor | None

    def shapes(self) -> dict[str, Shape]: ...

    def read(self, name: str, device: torch.device, shard: Shard) -> torch.Tensor:
        """``shard``'s slice of tensor ``name`` (``shard.start:shard.stop`` along ``shard.dim``)."""
        ...


Model = CausalLM | MLACausalLM


def build_model(config: ModelConfig | MLAConfig, freq_factors: torch.Tensor | None, tp: TPGroup) -> Model:
    """The decoder ``config`` describes: dense MLA (DeepSeek-V2/V3), sparse MLA with the DSA
    indexer (DeepSeek-V3.2) or the Llama-family ``CausalLM``."""
    if isinstance(config, MLAConfig):
        return mla_decoder(config)(config, tp)
    return CausalLM(config, freq_factors, tp)


def slots(model: Model, found: Mapping[str, Shape] | None = None) -> dict[str, Slot]:
    """Every checkpoint tensor ``model`` needs, by checkpoint name (tied heads need none); a MoE
    layer's expert tensors in the layout ``found`` (the checkpoint's shapes) holds."""
    params = dict(model.named_parameters())
    names = dict(GLOBAL_TENSORS)
    layer = MLA_LAYER_TENSORS if isinstance(model, MLACausalLM) else LAYER_TENSORS
    for i in range(model.cfg.num_layers):
        names |= {f"model.layers.{i}.{k}": (f"layers.{i}.{p}", part) for k, (p, part) in layer.items()}
    out = {}
    for name, (param, part) in names.items():
        if param in params:
            p = params[param]
            shard = p.shard(part) if hasattr(p, "shard") else whole(tuple(p.shape))
            out[name] = Slot(param, shard)
    moe = getattr(model.cfg, "moe", None)
    for i in range(model.cfg.num_layers) if moe is not None else ():
        if moe.is_sparse(i):
            out |= expert_slots(i, model.cfg.architecture, params, found or {}, moe)
    return with_scales(out, params)


def with_scales(out: Mapping[str, Slot], params: Mapping[str, torch.Tensor]) -> dict[str, Slot]:
    """``out`` with, after each weight an FP8-held projection loads (:func:`~graphrt.models.
    quantize.hold_fp8`), its per-row scale ``<name>_scale``: the rows of the weight's shard."""
    scaled = {}
    for name, slot in out.items():
        scaled[name] = slot
        if slot.param + "_scale" in params and slot.index is None and slot.expect is None:
            scaled[name + "_scale"] = Slot(slot.param + "_scale", scale_shard(slot.shard))
    return scaled


def check_tensors(expected: Mapping[str, Slot], found: Mapping[str, Shape], tied: bool) -> None:
    """Raise :class:`CheckpointError` on a missing, unexpected or wrongly shaped tensor."""
    missing = sorted(set(expected) - set(found))
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"checkpoint is missing tensor {missing[0]!r}{more}")
    optional = {"lm_head.weight"} if tied else set()
    extra = sorted(
        n
        for n in set(found) - set(expected) - optional
        if not n.endswith(IGNORED_SUFFIXES) and _kv_scale_key(n) is None
    )
    if extra:
        more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        raise CheckpointError(f"checkpoint has unexpected tensor {extra[0]!r}{more}")
    for name, slot in expected.items():
        if tuple(found[name]) != slot.shape:
            raise CheckpointError(
                f"tensor {name!r}: expected shape {list(slot.shape)} from the config, found {list(found[name])}"
            )


#: Head sizes, each at most some dimension of a checkpoint tensor, checked before the model is
#: built: its RoPE frequencies are computed on the host from them. NOTE: the other sizes only
#: shape meta tensors, and the per-tensor check names the tensor and both shapes.
TENSOR_SIZES = ("num_heads", "num_kv_heads", "head_dim", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


def check_config(config: ModelConfig | MLAConfig, found: Mapping[str, Shape]) -> None:
    """Raise :class:`CheckpointError` when the config names more layers than the checkpoint
    holds tensors for, or a head size (:data:`TENSOR_SIZES`) larger than every tensor dimension
    in it: before a model is built, even on the meta device (a damaged ``num_hidden_layers`` or
    ``head_dim`` of ``2**40`` would build for ever, or allocate its RoPE frequencies)."""
    held = [n.split(".", 3)[2] for n in found if n.startswith("model.layers.")]
    layers = max((int(i) + 1 for i in held if i.isdigit()), default=0)
    if config.num_layers > layers:
        raise CheckpointError(
            f"the config has {config.num_layers} hidden layers, the checkpoint tensors of {layers} "
            f"(missing tensor 'model.layers.{layers}.…')"
        )
    largest = max((int(d) for shape in found.values() for d in shape), default=0)
    for name in TENSOR_SIZES:
        value = getattr(config, name, None)
        if value is not None and value > largest:
            raise CheckpointError(
                f"config {name} = {value} is larger than every tensor dimension in the checkpoint "
                f"(at most {largest})"
            )


def materialize(
    source: TensorSource,
    device: torch.device,
    dtype: torch.dtype,
    tp: TPGroup = SINGLE,
    progress: Callable[[int, int], None] | None = None,
) -> Model:
    """Check ``source`` on the meta device, then allocate on ``device`` and copy every tensor in.

    With ``tp`` the model is this rank's shard and only the shard's slices are read.
    ``progress(done, total)`` is called after each tensor.
    """
    found = source.shapes()
    check_config(source.config, found)
    with torch.device("meta"):
        model = build_model(source.config, source.freq_factors, tp).to(dtype)  # NOTE: refuses a bad TP size
    expected = slots(model, found)
    scales = hold_layers(model, expected, source) if hasattr(source, "hold") else {}
    if scales:  # NOTE: FP8 checkpoint: its projections stay e4m3, with per-row scales
        found, expected = {**found, **scales}, slots(model, found)
    check_tensors(expected, found, source.config.tie_word_embeddings)
    kv = kv_scales(source, found, source.config.num_layers)  # NOTE: checked before allocating
    model = to_empty(model, device)
    model.tie()
    params = dict(model.named_parameters())
    for i, (name, slot) in enumerate(expected.items()):
        slot.load(params[slot.param], source.read(name, device, slot.read_shard))
        if progress is not None:
            progress(i + 1, len(expected))
    release_fp8(model)
    model.reset_rope(device)
    model.kv_scales = kv
    return model.eval()


def _kv_scale_key(name: str) -> tuple[int, str] | None:
    """``(layer, key)`` of a :data:`KV_SCALE_TENSORS` name, else None."""
    prefix, _, rest = name.partition("model.layers.")
    layer, _, key = rest.partition(".")
    return (int(layer), key) if not prefix and layer.isdigit() and key in KV_SCALE_TENSORS else None


def kv_scales(source: TensorSource, shapes: Mapping[str, Shape], num_layers: int) -> KVScales | None:
    """The checkpoint's per-layer K/V scales (:data:`KV_SCALE_TENSORS`, read on the CPU), or
    None when it has none. Raises :class:`CheckpointError` for a scale that is not one positive
    finite value, or a layer without its K or V scale when others have them."""
    found: dict[tuple[int, str], float] = {}
    for name, shape in shapes.items():
        at = _kv_scale_key(name)
        if at is None:
            continue
        if at[0] >= num_layers:
            raise CheckpointError(f"checkpoint has unexpected tensor {name!r} ({num_layers} layers)")
        if math.prod(shape) != 1:
            raise CheckpointError(f"tensor {name!r}: a KV scale holds one value, found shape {list(shape)}")
        value = float(source.read(name, torch.device("cpu"), Shard(0, 0, 1, 0, 1, tuple(shape))).item())
        for part in KV_SCALE_TENSORS[at[1]]:
            found[(at[0], part)] = value
    if not found:
        return None
    missing = [f"layer {i} {p}_scale" for i in range(num_layers) for p in "kv" if (i, p) not in found]
    if missing:
        raise CheckpointError(f"checkpoint has KV scales but not {missing[0]}")
    try:
        return KVScales.of(*([found[(i, p)] for i in range(num_layers)] for p in "kv"))
    except ValueError as err:
        raise CheckpointError(f"checkpoint KV scales: {err}") from None

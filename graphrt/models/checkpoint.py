"""Where each checkpoint tensor (Hugging Face names) lands in :class:`CausalLM`, and the checks.

Names follow transformers' Llama/Qwen layout; GGUF files are renamed to it first. Expected
shapes come from the model built on the meta device, so every check (a TP size that does not
divide the heads included) runs before any memory is allocated on the target device. With
tensor parallelism each parameter's :class:`~graphrt.models.parallel.Shard` says which rows or
columns of a checkpoint tensor this rank keeps, and the source reads only those.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import torch

from graphrt.models.causal_lm import CausalLM
from graphrt.models.errors import CheckpointError
from graphrt.models.hf_config import ModelConfig
from graphrt.models.parallel import SINGLE, Shard, copy_shard, to_empty, whole
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
    "self_attn.k_norm.weight": ("attn.k_norm.weight", None),
    "mlp.gate_proj.weight": ("mlp.gate_up.weight", 0),
    "mlp.up_proj.weight": ("mlp.gate_up.weight", 1),
    "mlp.down_proj.weight": ("mlp.down.weight", None),
}
#: Checkpoint names that may be present and are not loaded (RoPE tables are recomputed).
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class TensorSource(Protocol):
    """A checkpoint's config and tensors under Hugging Face names."""

    config: ModelConfig
    #: GGUF ``rope_freqs`` (llama3 scaling baked into the file), else ``None``.
    freq_factors: torch.Tensor | None

    def shapes(self) -> dict[str, Shape]: ...

    def read(self, name: str, device: torch.device, shard: Shard) -> torch.Tensor:
        """``shard``'s slice of tensor ``name`` (``shard.start:shard.stop`` along ``shard.dim``)."""
        ...


@dataclass(frozen=True, slots=True)
class Slot:
    """Where a checkpoint tensor lands: ``shard`` of parameter ``param``; ``shape`` is what the
    checkpoint must hold (the full tensor, whatever the TP size)."""

    param: str
    shard: Shard

    @property
    def shape(self) -> Shape:
        return self.shard.shape

    def view(self, param: torch.Tensor) -> torch.Tensor:
        """The part of ``param`` this checkpoint tensor fills (padding excluded)."""
        return param.narrow(self.shard.dim, self.shard.dest, self.shard.length)


def slots(model: CausalLM) -> dict[str, Slot]:
    """Every checkpoint tensor ``model`` needs, by checkpoint name (tied heads need none)."""
    params = dict(model.named_parameters())
    names = dict(GLOBAL_TENSORS)
    for i in range(model.cfg.num_layers):
        names |= {
            f"model.layers.{i}.{k}": (f"layers.{i}.{p}", part) for k, (p, part) in LAYER_TENSORS.items()
        }
    out = {}
    for name, (param, part) in names.items():
        if param in params:
            p = params[param]
            shard = p.shard(part) if hasattr(p, "shard") else whole(tuple(p.shape))
            out[name] = Slot(param, shard)
    return out


def check_tensors(expected: Mapping[str, Slot], found: Mapping[str, Shape], tied: bool) -> None:
    """Raise :class:`CheckpointError` on a missing, unexpected or wrongly shaped tensor."""
    missing = sorted(set(expected) - set(found))
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"checkpoint is missing tensor {missing[0]!r}{more}")
    optional = {"lm_head.weight"} if tied else set()
    extra = sorted(n for n in set(found) - set(expected) - optional if not n.endswith(IGNORED_SUFFIXES))
    if extra:
        more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        raise CheckpointError(f"checkpoint has unexpected tensor {extra[0]!r}{more}")
    for name, slot in expected.items():
        if tuple(found[name]) != slot.shape:
            raise CheckpointError(
                f"tensor {name!r}: expected shape {list(slot.shape)} from the config, found {list(found[name])}"
            )


def check_layers(num_layers: int, found: Mapping[str, Shape]) -> None:
    """Raise :class:`CheckpointError` when the config names more layers than the checkpoint
    holds tensors for (before a model of that many layers is built, even on the meta device)."""
    held = {
        int(n.split(".")[2]) for n in found if n.startswith("model.layers.") and n.split(".")[2].isdigit()
    }
    layers = max(held) + 1 if held else 0
    if num_layers > layers:
        raise CheckpointError(
            f"the config has {num_layers} hidden layers, the checkpoint tensors of {layers} "
            f"(missing tensor 'model.layers.{layers}.…')"
        )


def materialize(
    source: TensorSource, device: torch.device, dtype: torch.dtype, tp: TPGroup = SINGLE
) -> CausalLM:
    """Check ``source`` on the meta device, then allocate on ``device`` and copy every tensor in.

    With ``tp`` the model is this rank's shard and only the shard's slices are read.
    """
    found = source.shapes()
    check_layers(source.config.num_layers, found)
    with torch.device("meta"):
        model = CausalLM(source.config, source.freq_factors, tp).to(dtype)  # NOTE: refuses a bad TP size
    expected = slots(model)
    check_tensors(expected, found, source.config.tie_word_embeddings)
    model = to_empty(model, device)
    model.tie()
    params = dict(model.named_parameters())
    for name, slot in expected.items():
        copy_shard(params[slot.param], source.read(name, device, slot.shard), slot.shard)
    model.reset_rope(device)
    return model.eval()

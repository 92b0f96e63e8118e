"""Where a MoE layer's checkpoint tensors land in :class:`~graphrt.models.moe.SparseMoE`, per family.

Two layouts of the routed experts are accepted: one tensor per expert and projection (every
family's Hub files, and what transformers' ``save_pretrained`` writes for all but gpt-oss:
``experts.{e}.gate_proj.weight`` ``[I, H]``, Mixtral's ``w1`` / ``w3`` / ``w2``), and fused 3-D
tensors (``experts.gate_up_proj`` and ``experts.down_proj``: transformers' own layout, gate rows
then up rows; gpt-oss's is ``[E, H, 2 I]`` with gate and up *interleaved* and transposed, taken
apart at load into the contract's ``w13 [E, 2 I, H]``).

Under tensor parallelism each rank reads its slice of every expert's intermediate dim (the
parameters' ``shard``, :mod:`graphrt.models.experts`): rows of a per-expert gate / up tensor,
columns of a down tensor, the interleaved gate/up columns of gpt-oss's fused tensor (a rank's
gate and up columns are one contiguous run there). Transformers' own fused ``[E, 2 I, H]`` is
read whole and cut (a rank's gate and up rows are two runs). The router, its biases and
gpt-oss's ``down_proj_bias`` are read whole by every rank; a shared expert is split as the
dense MLP, or where it is fused into the experts as they are
(:mod:`graphrt.checkpoints.shared_experts`): the routed experts fill rows ``0 .. E - 1`` of the
expert tensors, the shared expert's pieces the rows after.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import torch

from graphrt.checkpoints.shared_experts import shared_expert_slots
from graphrt.checkpoints.slot import Slot, Transform
from graphrt.models.moe_config import MoESpec
from graphrt.models.parallel import Shard, cut, whole

Shape = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ExpertNames:
    """A family's MoE tensor names under ``model.layers.{i}.``: ``block`` (the MoE module),
    ``router`` (its linear), per-expert ``proj`` names (gate, up, down), the shared expert's
    module and whether fused expert tensors are transposed and interleaved (gpt-oss)."""

    block: str = "mlp"
    router: str = "gate"
    proj: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")
    shared: str = "shared_expert"
    interleaved: bool = False


MOE_NAMES: dict[str, ExpertNames] = {
    "MixtralForCausalLM": ExpertNames(block="block_sparse_moe", proj=("w1", "w3", "w2")),
    "Qwen2MoeForCausalLM": ExpertNames(),
    "Qwen3MoeForCausalLM": ExpertNames(),
    "OlmoeForCausalLM": ExpertNames(),
    "DeepseekV2ForCausalLM": ExpertNames(shared="shared_experts"),
    "DeepseekV3ForCausalLM": ExpertNames(shared="shared_experts"),
    "DeepseekV32ForCausalLM": ExpertNames(shared="shared_experts"),
    "GptOssForCausalLM": ExpertNames(router="router", interleaved=True),
}


def _deinterleave(t: torch.Tensor) -> torch.Tensor:
    """gpt-oss ``[..., 2 I]`` gate/up interleaved (gate ``[..., ::2]``) → gate half then up half."""
    return torch.cat((t[..., 0::2], t[..., 1::2]), dim=-1)


def _gate_up_t(t: torch.Tensor) -> torch.Tensor:
    """``[E, H, 2 I]`` interleaved → ``[E, 2 I, H]`` gate rows then up rows, in one copy.

    NOTE: an MXFP4 source hands over a transposed view of contiguous ``[E, 2 I, H]`` rows, so
    the rows are gathered straight from it (one layer's temporary, not three)."""
    rows = t.transpose(1, 2)
    return torch.cat((rows[:, 0::2], rows[:, 1::2]), dim=1)


def _down_t(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(1, 2).contiguous()


def _blocks(gate: Shard, up: Shard) -> Transform:
    """A whole ``[E, 2 I, ...]`` (gate rows then up rows) → this rank's ``[E, 2 i, ...]``."""

    def take(t: torch.Tensor) -> torch.Tensor:
        g, u = t.chunk(2, dim=1)
        return torch.cat((cut(g, gate), cut(u, up)), dim=1).contiguous()

    return take


def _pairs(shard: Shard, full: Shape, dim: int) -> Shard:
    """The interleaved gate/up run of this rank's intermediate slice ``shard``, along ``dim`` of ``full``."""
    start, stop = 2 * shard.start, 2 * shard.stop
    return Shard(dim, start, stop, 0, stop - start, full)


def _routed(param: torch.Tensor, experts: int) -> Shard:
    """All of this rank's ``param`` rows of the ``experts`` routed experts (dim 0 ``0 .. E - 1``)."""
    return whole((experts, *param.shape[1:]))


def _fused(
    pre: str, mine: str, names: ExpertNames, params: Mapping[str, torch.Tensor], e: int
) -> dict[str, Slot]:
    w13, w2, b13 = (params.get(f"{mine}.experts.{n}") for n in ("w13", "w2", "b13"))
    _, i2, h = w13.full_shape  # type: ignore[union-attr]
    local13, local2 = _routed(w13, e), _routed(w2, e)  # type: ignore[arg-type]
    cols = w2.shard()  # type: ignore[union-attr]  # NOTE: this rank's intermediate slice
    if names.interleaved:
        gu, down = (e, h, i2), (e, i2 // 2, h)
        out = {
            "gate_up_proj": Slot(f"{mine}.experts.w13", local13, None, _gate_up_t, gu, _pairs(cols, gu, 2)),
            "down_proj": Slot(
                f"{mine}.experts.w2",
                local2,
                None,
                _down_t,
                down,
                Shard(1, cols.start, cols.stop, 0, cols.length, down),
            ),
        }
    else:
        take = _blocks(w13.shard("gate"), w13.shard("up"))  # type: ignore[union-attr]
        out = {
            "gate_up_proj": Slot(f"{mine}.experts.w13", local13, None, take, (e, i2, h)),
            "down_proj": Slot(f"{mine}.experts.w2", replace(cols, shape=(e, *cols.shape[1:])), slice(0, e)),
        }
    if b13 is not None:
        local = _routed(b13, e)
        out["gate_up_proj_bias"] = (
            Slot(f"{mine}.experts.b13", local, None, _deinterleave, (e, i2), _pairs(cols, (e, i2), 1))
            if names.interleaved
            else Slot(
                f"{mine}.experts.b13", local, None, _blocks(b13.shard("gate"), b13.shard("up")), (e, i2)
            )
        )
        out["down_proj_bias"] = Slot(f"{mine}.experts.b2", whole((e, h)))
    return {f"{pre}.experts.{k}": v for k, v in out.items()}


def _one_expert(shard: Shard) -> Shard:
    """``shard`` of a 3-D expert weight as the shard of one expert's 2-D tensor (dim 0 dropped)."""
    return Shard(shard.dim - 1, shard.start, shard.stop, shard.dest, shard.size, shard.shape[1:])


def _per_expert(
    pre: str, mine: str, names: ExpertNames, params: Mapping[str, torch.Tensor], e: int
) -> dict[str, Slot]:
    w13, w2 = params[f"{mine}.experts.w13"], params[f"{mine}.experts.w2"]
    gate, up, down = names.proj
    shards = {
        gate: (f"{mine}.experts.w13", _one_expert(w13.shard("gate"))),  # type: ignore[operator]
        up: (f"{mine}.experts.w13", _one_expert(w13.shard("up"))),  # type: ignore[operator]
        down: (f"{mine}.experts.w2", _one_expert(w2.shard())),  # type: ignore[operator]
    }
    return {
        f"{pre}.experts.{x}.{proj}.weight": Slot(param, shard, x)
        for x in range(e)
        for proj, (param, shard) in shards.items()
    }


def _shard(param: torch.Tensor, part: int | None = None) -> Shard:
    """A parameter's shard (of block ``part``): its own ``shard`` when sharded, else all of it."""
    return param.shard(part) if hasattr(param, "shard") else whole(tuple(param.shape))


def expert_slots(
    layer: int, arch: str, params: Mapping[str, torch.Tensor], found: Mapping[str, Shape], spec: MoESpec
) -> dict[str, Slot]:
    """The routed experts', router's and shared expert's checkpoint tensors of MoE layer ``layer``
    (of ``spec``), by checkpoint name (the fused layout when the checkpoint holds it, else per
    expert), each this rank's shard."""
    names = MOE_NAMES[arch]
    pre, mine = f"model.layers.{layer}.{names.block}", f"layers.{layer}.mlp"
    fused = f"{pre}.experts.gate_up_proj" in found
    out = (_fused if fused or names.interleaved else _per_expert)(pre, mine, names, params, spec.num_experts)
    out |= shared_expert_slots(f"{pre}.{names.shared}", mine, spec, params)
    simple = {
        f"{names.router}.weight": ("gate.weight", None),
        f"{names.router}.bias": ("gate.bias", None),
        f"{names.router}.e_score_correction_bias": ("score_bias", None),
        "shared_expert_gate.weight": ("shared_gate.weight", None),
        f"{names.shared}.gate_proj.weight": ("shared.gate_up.weight", 0),
        f"{names.shared}.up_proj.weight": ("shared.gate_up.weight", 1),
        f"{names.shared}.down_proj.weight": ("shared.down.weight", None),
    }
    for key, (param, part) in simple.items():
        if f"{mine}.{param}" in params:
            out[f"{pre}.{key}"] = Slot(f"{mine}.{param}", _shard(params[f"{mine}.{param}"], part))
    return out

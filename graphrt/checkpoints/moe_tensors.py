"""Where a MoE layer's checkpoint tensors land in :class:`~graphrt.models.moe.SparseMoE`, per family.

Two layouts of the routed experts are accepted: one tensor per expert and projection (every
family's Hub files, and what transformers' ``save_pretrained`` writes for all but gpt-oss:
``experts.{e}.gate_proj.weight`` ``[I, H]``, Mixtral's ``w1`` / ``w3`` / ``w2``), and fused 3-D
tensors (``experts.gate_up_proj`` and ``experts.down_proj``: transformers' own layout, gate rows
then up rows; gpt-oss's is ``[E, H, 2 I]`` with gate and up *interleaved* and transposed, taken
apart at load into the contract's ``w13 [E, 2 I, H]``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from graphrt.checkpoints.slot import Slot
from graphrt.models.parallel import Shard, whole

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


def _fused(pre: str, mine: str, names: ExpertNames, w13: Shape, w2: Shape, bias: bool) -> dict[str, Slot]:
    e, i2, h = w13
    if names.interleaved:
        out = {
            f"{pre}.experts.gate_up_proj": Slot(
                f"{mine}.experts.w13", whole(w13), None, _gate_up_t, (e, h, i2)
            ),
            f"{pre}.experts.down_proj": Slot(f"{mine}.experts.w2", whole(w2), None, _down_t, (e, i2 // 2, h)),
        }
    else:
        out = {
            f"{pre}.experts.gate_up_proj": Slot(f"{mine}.experts.w13", whole(w13)),
            f"{pre}.experts.down_proj": Slot(f"{mine}.experts.w2", whole(w2)),
        }
    if bias:
        b13 = _deinterleave if names.interleaved else None
        out[f"{pre}.experts.gate_up_proj_bias"] = Slot(
            f"{mine}.experts.b13", whole((e, i2)), None, b13, (e, i2) if b13 else None
        )
        out[f"{pre}.experts.down_proj_bias"] = Slot(f"{mine}.experts.b2", whole((e, h)))
    return out


def _per_expert(pre: str, mine: str, names: ExpertNames, w13: Shape) -> dict[str, Slot]:
    e, i2, h = w13
    i = i2 // 2
    gate, up, down = names.proj
    out = {}
    for x in range(e):
        out[f"{pre}.experts.{x}.{gate}.weight"] = Slot(f"{mine}.experts.w13", Shard(0, 0, i, 0, i, (i, h)), x)
        out[f"{pre}.experts.{x}.{up}.weight"] = Slot(f"{mine}.experts.w13", Shard(0, 0, i, i, i, (i, h)), x)
        out[f"{pre}.experts.{x}.{down}.weight"] = Slot(f"{mine}.experts.w2", whole((h, i)), x)
    return out


def expert_slots(
    layer: int, arch: str, params: Mapping[str, torch.Tensor], found: Mapping[str, Shape]
) -> dict[str, Slot]:
    """The routed experts', router's and shared expert's checkpoint tensors of MoE layer ``layer``,
    by checkpoint name (the fused layout when the checkpoint holds it, else per expert)."""
    names = MOE_NAMES[arch]
    pre, mine = f"model.layers.{layer}.{names.block}", f"layers.{layer}.mlp"
    w13 = tuple(params[f"{mine}.experts.w13"].shape)
    w2 = tuple(params[f"{mine}.experts.w2"].shape)
    fused = f"{pre}.experts.gate_up_proj" in found
    bias = f"{mine}.experts.b13" in params
    out = (
        _fused(pre, mine, names, w13, w2, bias)
        if fused or names.interleaved
        else _per_expert(pre, mine, names, w13)
    )
    simple = {
        f"{names.router}.weight": "gate.weight",
        f"{names.router}.bias": "gate.bias",
        f"{names.router}.e_score_correction_bias": "score_bias",
        "shared_expert_gate.weight": "shared_gate.weight",
        f"{names.shared}.down_proj.weight": "shared.down.weight",
    }
    for key, param in simple.items():
        if f"{mine}.{param}" in params:
            shape = tuple(params[f"{mine}.{param}"].shape)
            out[f"{pre}.{key}"] = Slot(f"{mine}.{param}", whole(shape))
    shared = params.get(f"{mine}.shared.gate_up.weight")
    if shared is not None:
        s, h = shared.shape[0] // 2, shared.shape[1]
        for j, proj in enumerate(("gate_proj", "up_proj")):
            out[f"{pre}.{names.shared}.{proj}.weight"] = Slot(
                f"{mine}.shared.gate_up.weight", Shard(0, 0, s, j * s, s, (s, h))
            )
    return out

"""What makes a decoder's MLPs mixtures of experts: :class:`MoESpec`, one per model."""

from __future__ import annotations

from dataclasses import dataclass

#: How router scores are made and top-k chosen (:mod:`graphrt.models.router`):
#: ``softmax`` (Mixtral, Qwen-MoE, OLMoE, DeepSeek-V2 ``greedy``), ``group_limited`` (DeepSeek-V2's
#: softmax with group-limited greedy selection), ``sigmoid`` (DeepSeek-V3's scores, the
#: ``e_score_correction_bias`` and grouped top-k), ``topk_softmax`` (gpt-oss: top-k of the
#: logits, then softmax over the chosen).
SCORINGS = ("softmax", "group_limited", "sigmoid", "topk_softmax")


@dataclass(frozen=True, slots=True)
class MoESpec:
    """A model's routed experts; field names follow transformers' configs where they exist.

    ``num_experts`` experts of intermediate size ``expert_size``, ``topk`` per token, routed by
    ``scoring`` (:data:`SCORINGS`). ``n_group`` / ``topk_group``: grouped top-k (DeepSeek).
    ``norm_topk_prob``: the chosen weights are renormalised to sum 1; ``routed_scaling_factor``
    multiplies them after. ``score_bias``: DeepSeek-V3's ``e_score_correction_bias`` (choice
    only); ``router_bias``: the router linear has a bias (gpt-oss); ``router_fp32``: it runs in
    float32 (DeepSeek), else in the model's dtype. ``shared_size``: the shared
    expert's intermediate size (0: none); ``shared_gate``: Qwen2-MoE's sigmoid gate on it;
    ``fuse_shared``: run an ungated one as :attr:`shared_slots` extra experts where it can.
    ``activation`` (``silu`` or gpt-oss's ``swiglu_clamp``) and ``expert_bias``: the experts'
    SwiGLU and biases. ``sparse``: per layer, whether it is MoE (else a dense MLP).
    """

    num_experts: int
    topk: int
    expert_size: int
    sparse: tuple[bool, ...]
    scoring: str = "softmax"
    norm_topk_prob: bool = False
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    score_bias: bool = False
    router_bias: bool = False
    router_fp32: bool = False
    shared_size: int = 0
    shared_gate: bool = False
    activation: str = "silu"
    expert_bias: bool = False
    fuse_shared: bool = True

    def __post_init__(self) -> None:
        if self.scoring not in SCORINGS:
            raise ValueError(
                f"MoE scoring {self.scoring!r} is not supported; supported: {', '.join(SCORINGS)}"
            )
        if not 1 <= self.topk <= self.num_experts:
            raise ValueError(
                f"num_experts_per_tok {self.topk} must be in 1..num_experts ({self.num_experts})"
            )
        if self.num_experts % self.n_group or not 1 <= self.topk_group <= self.n_group:
            raise ValueError(
                f"n_group {self.n_group} must divide num_experts {self.num_experts} and "
                f"topk_group {self.topk_group} be in 1..n_group"
            )

    @property
    def shared_slots(self) -> int:
        """``S``: the shared expert cut into ``S`` pieces of ``expert_size``, held as experts
        ``num_experts .. num_experts + S - 1`` that every token routes to with weight 1 (the
        SwiGLU is elementwise over the intermediate dim, so the pieces' outputs sum to the
        shared expert's). 0 (a separate dense MLP) without ``fuse_shared``, for a gated shared
        expert, one whose size ``expert_size`` does not divide, or experts of another SwiGLU."""
        plain = self.activation == "silu" and not self.expert_bias and not self.shared_gate
        divides = self.expert_size > 0 and self.shared_size % self.expert_size == 0
        if not (self.fuse_shared and plain and divides):
            return 0
        return self.shared_size // self.expert_size

    @property
    def total_experts(self) -> int:
        """Routed plus fused shared experts: the expert tensors' dim 0, and the pad rows' id."""
        return self.num_experts + self.shared_slots

    @property
    def total_topk(self) -> int:
        """Slots per token of the routing buffers: ``topk`` routed plus :attr:`shared_slots`."""
        return self.topk + self.shared_slots

    def is_sparse(self, layer_id: int) -> bool:
        """Whether layer ``layer_id``'s MLP is the mixture of experts."""
        return self.sparse[layer_id]


def qwen_sparse(num_layers: int, step: int = 1, dense: tuple[int, ...] = ()) -> tuple[bool, ...]:
    """Qwen2/3-MoE: layer ``i`` is MoE when ``(i + 1) % decoder_sparse_step == 0`` and it is not
    in ``mlp_only_layers``."""
    return tuple((i + 1) % step == 0 and i not in dense for i in range(num_layers))


def deepseek_sparse(num_layers: int, first_dense: int = 0, freq: int = 1) -> tuple[bool, ...]:
    """DeepSeek: layer ``i`` is MoE when ``i >= first_k_dense_replace`` and ``i % moe_layer_freq == 0``."""
    return tuple(i >= first_dense and i % freq == 0 for i in range(num_layers))

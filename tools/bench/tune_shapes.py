"""What ``graphrt tune`` times for each ``--models`` preset: its GEMM shapes and its experts.

A dense Llama-style preset: every projection of :func:`graphrt.tools.bench.gemm.projections`.
A MoE preset (:mod:`graphrt.models.moe_presets`): the attention projections (qkv, o) and lm_head,
the dense MLP only where the preset has dense layers, the shared expert's MLP where it has one,
and its routed experts' shape (:func:`expert_shape`, the MoE part's). An MLA preset's attention
multiplies other weights through its own step (``graphrt bench mla`` times it), so the GEMM
sweeps take only its lm_head, dense and shared MLPs (:func:`notes` says so).
"""

from __future__ import annotations

from graphrt.models.presets import LlamaConfig, MLAConfig, preset
from graphrt.tools.bench import gemm
from graphrt.tools.bench.moe import Shape as ExpertShape
from graphrt.tools.cli.args import UsageError

#: ``(model, projection, K, N)`` of a tuned weight.
Shape = tuple[str, str, int, int]


def _config(model: str) -> LlamaConfig | MLAConfig:
    cfg = preset(model)
    dense_llama = isinstance(cfg, LlamaConfig)
    if not (dense_llama or (isinstance(cfg, MLAConfig) and cfg.moe is not None)):
        raise UsageError(
            "--models", model, "is not a Llama-style preset (dense or MoE) nor an MLA MoE preset"
        )
    return cfg


def projections(cfg: LlamaConfig | MLAConfig) -> list[tuple[str, int, int]]:
    """``(name, K, N)`` of every weight a decode step of ``cfg`` multiplies by outside the routed
    experts (an MLA preset's attention left out)."""
    spec, h = cfg.moe, cfg.hidden_size
    if spec is None:
        return gemm.projections(cfg)
    out = []
    if isinstance(cfg, LlamaConfig):
        out += [p for p in gemm.projections(cfg) if p[0] in ("qkv", "o")]
    if not all(spec.sparse):  # NOTE: Qwen's mlp_only_layers, DeepSeek's first dense layers
        out += [("gate_up", h, 2 * cfg.intermediate_size), ("down", cfg.intermediate_size, h)]
    if spec.shared_size and not spec.shared_slots:  # NOTE: a fused one runs in the expert kernels
        out += [("shared_gate_up", h, 2 * spec.shared_size), ("shared_down", spec.shared_size, h)]
    return [*out, ("lm_head", h, cfg.vocab_size)]


def shapes(models: list[str], shrink: int = 1) -> list[Shape]:
    """``(model, projection, K, N)`` of every weight of ``models`` (shrunk ``shrink`` times)."""
    out = []
    for model in models:
        out += [(model, name, k // shrink, n // shrink) for name, k, n in projections(_config(model))]
    return out


def expert_shape(model: str) -> ExpertShape | None:
    """``(E, k, H, I, activation, biases)`` of one layer's experts as the kernels see them (the fused
    shared experts counted in ``E`` and ``k``; None: a dense preset), as ``graphrt bench moe``'s
    shapes are written."""
    cfg = _config(model)
    spec = cfg.moe
    if spec is None:
        return None
    return (
        spec.total_experts,
        spec.total_topk,
        cfg.hidden_size,
        spec.expert_size,
        spec.activation,
        spec.expert_bias,
    )


def moe_models(models: list[str]) -> list[str]:
    """The MoE presets among ``models``."""
    return [m for m in models if expert_shape(m) is not None]


def notes(models: list[str]) -> list[str]:
    """One line per preset whose weights the sweeps leave out (an MLA preset's attention)."""
    return [
        f"{m}: its MLA attention projections are not swept (graphrt bench mla times that step); "
        "its lm_head, dense and shared MLPs and its experts are"
        for m in models
        if isinstance(_config(m), MLAConfig)
    ]

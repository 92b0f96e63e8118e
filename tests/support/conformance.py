"""The attention conformance suite's cases: each registered backend against the reference
backend's outputs, per feature, on the same weights, prefill and batch (both runtimes graphed).

A feature names the capabilities it needs (:class:`graphrt.attention.GraphSupport` fields) and
its forward mode; a backend that declares them must match the reference, one that does not must
be refused when its runtime is built, naming the backend.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from graphrt import Batch
from graphrt.attention import registry
from graphrt.models.presets import PRESETS
from graphrt.step.modes import ForwardMode, SpecGeometry
from tests.runtime.test_spec_modes import CONTEXT, ROWS, SCRATCH, draft_batch, filled, verify_batch
from tests.support.util import Setup, build_runtime, spec_batch

M = ForwardMode
CHAIN = SpecGeometry(num_steps=3)
TREE = SpecGeometry(num_steps=3, topk=2, num_draft_tokens=5)


@dataclass(frozen=True)
class Feature:
    """What one conformance case runs: attention ``kind``, ``model`` preset, KV cache dtype,
    speculative geometry, the step's ``mode``, and the capabilities it ``needs``."""

    kind: str
    model: str
    kv: str | None
    spec: SpecGeometry
    mode: ForwardMode
    needs: tuple[str, ...] = ()


FEATURES = {
    "decode": Feature("mha", "tiny-llama", None, CHAIN, M.DECODE),
    "chain_verify": Feature("mha", "tiny-llama", None, CHAIN, M.TARGET_VERIFY),
    "tree_verify": Feature("mha", "tiny-llama", None, TREE, M.TARGET_VERIFY, ("trees",)),
    "draft_decode": Feature("mha", "tiny-llama", None, CHAIN, M.DRAFT_DECODE),
    "draft_extend": Feature("mha", "tiny-llama", None, CHAIN, M.DRAFT_EXTEND),
    "window": Feature("mha", "tiny-llama-swa", None, CHAIN, M.TARGET_VERIFY, ("window",)),
    "chunked_local": Feature("mha", "tiny-llama-local", None, CHAIN, M.DECODE, ("chunked_local",)),
    "sinks": Feature("mha", "tiny-sinks-full", None, CHAIN, M.TARGET_VERIFY, ("sinks",)),
    "fp8_kv": Feature("mha", "tiny-llama", "fp8_e4m3", CHAIN, M.TARGET_VERIFY, ("fp8_kv",)),
    "mla_tree": Feature("mla", "tiny-mla", None, TREE, M.TARGET_VERIFY, ("qv", "trees")),
    "sparse_mla": Feature("sparse_mla", "tiny-dsa", None, CHAIN, M.TARGET_VERIFY),
}

#: What each kind's ``available`` is asked beside the dtype (the cache layout of sparse MLA).
CPU_NEED = {"mha": {}, "mla": {}, "sparse_mla": {"layout": "bf16"}}


def add_presets(monkeypatch: pytest.MonkeyPatch) -> None:
    """``tiny-sinks-full``: gpt-oss-style sinks on every layer, without the sliding window."""
    full = dataclasses.replace(PRESETS["tiny-sinks"], sliding_window=None)
    monkeypatch.setitem(PRESETS, "tiny-sinks-full", full)


def cpu_dtype(kind: str, name: str) -> torch.dtype | None:
    """The model dtype backend ``name`` runs with on the CPU (fp32, else bf16), or None: GPU only."""
    cls, cpu = registry.backend_class(kind, name), torch.device("cpu")
    for dtype in (torch.float32, torch.bfloat16):
        need = CPU_NEED[kind] or {"dtype": dtype}
        if cls.available(cpu, **need):
            return dtype
    return None


def cases(extra: dict[str, str]) -> list:
    """``parametrize`` values ``(kind, backend, feature, device)`` for every registered row (and
    the ``extra`` MHA rows a test adds) but the reference: CPU where it runs, GPU-marked else."""
    out = []
    for kind, rows in registry.BACKENDS.items():
        names = [n for n in rows if n != "reference"] + (list(extra) if kind == "mha" else [])
        for name in names:
            for feature, f in FEATURES.items():
                if f.kind != kind:
                    continue
                on_cpu = name in extra or cpu_dtype(kind, name) is not None
                marks = () if on_cpu else (pytest.mark.gpu,)
                device = "cpu" if on_cpu else "cuda"
                out.append(pytest.param(kind, name, feature, device, marks=marks, id=f"{name}-{feature}"))
    return out


def setup(device: torch.device, f: Feature, backend: str, dtype: torch.dtype | None) -> Setup:
    modes = (f.mode,) + ((M.DRAFT_EXTEND,) if f.mode is M.DRAFT_DECODE else ())
    return build_runtime(
        device, backend=backend, model=f.model, kv_cache_dtype=f.kv, modes=modes, speculative=f.spec,
        buckets=(4,), max_batch_size=4, max_reqs=ROWS + SCRATCH, max_context_len=CONTEXT, dtype=dtype,
    )  # fmt: skip


def batch(s: Setup, f: Feature, reqs: list[int], lens: list[int], rng: np.random.Generator) -> Batch:
    """A batch of ``f.mode`` for rows ``reqs`` holding ``lens`` tokens (DRAFT_EXTEND: ragged)."""
    if f.mode is M.TARGET_VERIFY:
        return verify_batch(s, f.spec, reqs, lens, rng)
    if f.mode is M.DRAFT_DECODE:
        return draft_batch(s, f.spec, reqs, lens, rng)
    q_lens = [1] * len(reqs) if f.mode is M.DECODE else [f.spec.num_draft_tokens, 1, 2]
    seq_lens = [lens[r] + q for r, q in zip(reqs, q_lens, strict=True)]
    return spec_batch(s, f.mode, reqs, seq_lens, q_lens, rng)


def step(s: Setup, f: Feature, seed: int = 3) -> torch.Tensor:
    """Prefill ``ROWS`` rows, then one graphed step of ``f.mode`` for three of them."""
    rng = np.random.default_rng(seed)
    lens = filled(s, rng)
    before = sum(s.runtime.stats().replays.values())
    out = s.runtime.run(batch(s, f, [5, 0, 2], lens, rng))
    assert sum(s.runtime.stats().replays.values()) == before + 1, "the step did not replay a graph"
    return out


def conforms(kind: str, name: str, feature: str, device: torch.device, dtype: torch.dtype | None) -> None:
    """Backend ``name`` on ``feature``: equal to the reference's outputs where it declares what
    the feature needs, refused at build time (naming it) where it does not."""
    f = FEATURES[feature]
    support = registry.graph_support(kind, name)
    if f.mode not in support.modes or not all(getattr(support, n) for n in f.needs):
        with pytest.raises(
            ValueError,
            match=rf"attention backend '{name}' (cannot be captured|does not declare|is not available)",
        ):
            setup(device, f, name, dtype)
        return
    got = step(setup(device, f, name, dtype), f)
    want = step(setup(device, f, "reference", dtype), f)
    if got.dtype == torch.int64:  # NOTE: DRAFT_DECODE's tokens; later steps feed on earlier ones
        agree = (got == want).float().mean().item()
        assert agree >= (1.0 if dtype == torch.float32 else 0.8), f"{name} {feature}: tokens agree {agree}"
        return
    err = ((got.float() - want.float()).norm() / want.float().norm()).item()
    bound = 1e-5 if dtype == torch.float32 else (5e-2 if f.kv else 2e-2)
    assert err <= bound, f"{name} {feature}: logits differ from the reference's by {err:.3g} (> {bound})"

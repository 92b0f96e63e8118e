"""A speculative verify chain (topk 1) through the split decode kernel in a graphed model step:
each request's query tokens as rows, each seeing the keys up to its own, the new keys stored by
``rope_store`` first (rows read each other's). Runs on the CPU under ``TRITON_INTERPRET=1`` (a
CPU box with Triton reruns this file so, last test); the kernel's own cases are in
tests/attention/test_decode_attend.py.
"""

from __future__ import annotations

import pytest
import torch

from graphrt.attention.split_decode import attend as dk
from tests.support import conformance
from tests.support.triton_util import INTERPRET, rerun_marks, rerun_under_interpreter


@pytest.mark.skipif(dk.triton is None or not INTERPRET, reason="the CPU model under the interpreter only")
def test_a_graphed_verify_chain_runs_through_the_kernel(monkeypatch) -> None:
    """tiny-llama in bf16 on the split decode backend (the interpreter), a graphed TARGET_VERIFY
    chain: every layer's chain (a request's query tokens as rows, each seeing the keys up to its
    own) goes to the kernel with its keys stored by ``rope_store`` first, never fused; the logits
    within the conformance suite's bf16 bound of the reference backend's, the same tokens."""
    cpu, f = torch.device("cpu"), conformance.FEATURES["chain_verify"]
    monkeypatch.setenv(dk.ENV, "interpret")
    seen: list[tuple[int, bool]] = []
    attend = dk.attend

    def kernel(q, k_cache, v_cache, meta, scale, window=None, sinks=None, fresh=None) -> torch.Tensor:
        seen.append((dk.chain_of(q, meta), fresh is not None))
        return attend(q, k_cache, v_cache, meta, scale, window, sinks, fresh)

    monkeypatch.setattr(dk, "attend", kernel)
    got = conformance.step(conformance.setup(cpu, f, "split_decode", torch.bfloat16), f)
    assert seen and all(c == f.spec.num_draft_tokens and not fused for c, fused in seen), seen
    want = conformance.step(conformance.setup(cpu, f, "reference", torch.bfloat16), f)
    err = ((got.float() - want.float()).norm() / want.float().norm()).item()
    assert err <= 2e-2, f"logits differ from the reference's by {err:.3g}"
    assert torch.equal(got.float().argmax(-1), want.float().argmax(-1)), "tokens differ"


@rerun_marks
def test_kernel_under_triton_interpreter() -> None:
    """On a CPU box: this file again, with the kernels run by Triton's interpreter."""
    rerun_under_interpreter(__file__, passed=1)

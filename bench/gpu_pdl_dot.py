"""Dump the DOT of a small CUDA graph whose kernels carry programmatic (PDL) edges, to read how
cudaGraphDebugDotPrint shows them: ``python bench/gpu_pdl_dot.py OUT_DIR``."""

from __future__ import annotations

import sys

import torch

from graphrt.models import ops
from graphrt.models.skinny import skinny_linear


def main(out: str) -> None:
    x = torch.randn(1, 2048, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16) * 0.02
    norm = torch.ones(2048, device="cuda", dtype=torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    graph.enable_debug_mode()
    for _ in range(2):
        y = ops.rms_norm(skinny_linear(skinny_linear(x, w), w), norm, 1e-6)
    with torch.cuda.graph(graph):
        y = ops.rms_norm(skinny_linear(skinny_linear(x, w), w), norm, 1e-6)
    graph.replay()
    torch.cuda.synchronize()
    graph.debug_dump(f"{out}/pdl.dot")
    print("dumped", y.shape)


if __name__ == "__main__":
    main(sys.argv[1])

"""The MoE kernels compiled for sm_90 by Triton's CUDA compiler (no GPU needed): they build at the
dispatch's tiles, wait on the previous kernel (PDL) and spill no register."""

from __future__ import annotations

import pytest

from graphrt.kernels import tuning
from graphrt.kernels.moe import BLOCK_M
from graphrt.kernels.moe import align_triton as at
from graphrt.kernels.moe import grouped as gr
from graphrt.kernels.moe import skinny_experts as sx
from graphrt.kernels.moe import triton_experts as te
from graphrt.kernels.switches import triton
from tests.support.triton_util import INTERPRET, NO_SPILLS, ptxas_report, sm90_ptx

pytestmark = pytest.mark.skipif(triton is None, reason="needs Triton")
T = tuning.DEFAULT.moe
UP, DOWN = T.skinny_up(), T.skinny_down()
BF16 = {"x", "w13", "b13", "inter", "w2", "b2", "out"}
F32 = {"topk_weights", "buf", "parts"}
INTS = {"S", "H", "INTER", "TOPK", "x_stride", "E", "NK", "BOUND", "NBLOCKS", "N"}
#: ``kernel: (constexprs, warps, stages)``: Qwen3-30B-A3B's gate and up, gpt-oss's biases.
KERNELS = {
    "grouped_up": (gr._grouped_up, dict(BM=BLOCK_M, BN=T.block_n, BK=T.block_k, ACT=1, HAS_BIAS=True, F32_DOT=False), T.warps, T.stages),
    "grouped_down": (gr._grouped_down, dict(BM=BLOCK_M, BN=T.block_n, BK=T.block_k, HAS_BIAS=True, F32_DOT=False), T.warps, T.stages),
    "skinny_up": (sx._skinny_up, dict(BN=UP[0] // 2, BK=UP[1], ACT=0, HAS_BIAS=True), UP[2], 1),
    "skinny_down": (sx._skinny_down, dict(BN=DOWN[0], BK=DOWN[1], SPLIT=1, HAS_BIAS=True), DOWN[2], 1),
    "skinny_down_split": (sx._skinny_down, dict(BN=DOWN[0], BK=DOWN[1], SPLIT=8, HAS_BIAS=True), DOWN[2], 1),
    "sum_parts": (sx._sum_parts, dict(SPLIT=8, BLOCK=te.SUM_BLOCK), 4, 1),
    "align": (at._align, dict(BLOCK_E=128, CHUNK=at.CHUNK_CELLS // 128, FILL=at.FILL, BM=BLOCK_M), 4, 1),
    "sum_topk": (te._sum_topk, dict(BH=1024), 4, 1),
}  # fmt: skip


def _type(arg: str) -> str:
    if arg in BF16:
        return "*bf16"
    if arg in F32:
        return "*fp32"
    return "i32" if arg in INTS else "*i32"


@pytest.mark.skipif(INTERPRET, reason="needs Triton's compiler (TRITON_INTERPRET=1 wraps every kernel)")
@pytest.mark.parametrize("name", list(KERNELS))
def test_compiles_for_sm90_with_pdl_and_no_spills(name: str) -> None:
    fn, constexprs, warps, stages = KERNELS[name]
    constexprs = constexprs | {"PDL": True}
    signature = {a: "constexpr" if a in constexprs else _type(a) for a in fn.arg_names}
    ptx = sm90_ptx(fn, signature, constexprs, {"num_warps": warps, "num_stages": stages})
    assert "griddepcontrol.wait" in ptx and "griddepcontrol.launch_dependents" in ptx
    assert NO_SPILLS in ptxas_report(ptx)

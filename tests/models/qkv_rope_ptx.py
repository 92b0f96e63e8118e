"""The sm_90a build of ``qkv_rope_gemm`` (and of ``prologue_norm_gemm``, to compare) and ptxas's
report on it, as the model launches them: bf16, PDL, the residual add, no bias, 4 warps, one
2048-wide K tile up to a hidden size of 2048 (else a loop), 16-divisible pointers and sizes."""

from __future__ import annotations

from tests.triton_util import ptxas_report, sm90_ptx

#: The arguments a launch specialises as 16-divisible (pointers, K, the weight's row stride).
_DIVISIBLE = (
    "x",
    "res",
    "nw",
    "w",
    "bias",
    "q",
    "y",
    "new",
    "cos_sin",
    "k_cache",
    "v_cache",
    "loc",
    "K",
    "w_stride",
)


def compile_ptx(d: int, hidden: int, heads: tuple[int, int] = (32, 8), norm_gemm: bool = False) -> str:
    """PTX of the fused kernel for head dim ``d`` (or of the norm GEMM alone with ``norm_gemm``)."""
    from graphrt.models.prologue_kernel import prologue_norm_gemm
    from graphrt.models.qkv_rope_kernel import qkv_rope_gemm

    common = dict(BLOCK_K=2048, ADD=True, HAS_BIAS=False, BF16=True, PDL=True, ONE_TILE=hidden <= 2048)
    if norm_gemm:
        fn, constexprs = prologue_norm_gemm, dict(BLOCK_N=8, **common)
        ints = {"N": "i32", "K": "i32", "w_stride": "i32", "eps": "fp32"}
    else:
        fn, constexprs = qkv_rope_gemm, dict(HQ=heads[0], HK=heads[1], HALF=d // 2, **common)
        ints = {"K": "i32", "w_stride": "i32", "eps": "fp32"}
    pointers = [a for a in fn.arg_names if a not in ints and a not in constexprs]
    types = {"loc": "*i64", "cos_sin": "*bf16"}
    signature = {a: types.get(a, "*bf16") for a in pointers} | ints | dict.fromkeys(constexprs, "constexpr")
    signature = {a: signature[a] for a in fn.arg_names}
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in _DIVISIBLE if a in fn.arg_names}
    return sm90_ptx(fn, signature, constexprs, {"num_warps": 4}, attrs)


if __name__ == "__main__":
    for d, hidden in ((64, 2048), (64, 576), (128, 4096)):
        for norm_gemm in (True, False):
            lines = ptxas_report(compile_ptx(d, hidden, norm_gemm=norm_gemm)).strip().splitlines()
            name = "prologue_norm_gemm" if norm_gemm else "qkv_rope_gemm"
            print(f"D {d} K {hidden} {name}:", *(line.split("info    : ")[-1] for line in lines[-3:-1]))

#!/usr/bin/env bash
# GPU runs of 2026-12-07 (third session), after .gpu/install.sh (the base tree cf1691c carried in
# .gpu/base for the A/B):
#   bash bench/gpu_session10.sh ab|tests|nopdl
# ab:    bench model of the MoE shapes at bs 1 with the base tree (before the router GEMV and the
#        fused shared experts) and then this tree at bs 1 / 16 / 64, in one call (SHAPES).
# tests: the GPU tests of the router GEMV, the fused shared experts and the MoE kernels.
# nopdl: bench model bs 1 with GRAPHRT_PDL=0, so each kernel's profiled time is its own (with PDL a
#        kernel starts early and its time includes the wait for the one before).
set -uo pipefail
export PYTHONPATH=/tmp/sglk${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 XDG_CACHE_HOME=/tmp/xdg
what=${1:?ab|tests}
log="$OUT/s10_$what.log"
source bench/gpu_prelude.sh
mkdir -p "$OUT/json"
run() { echo "== $*" | tee -a "$log"; timeout "${LIMIT:-200}" "$@" 2>&1 | grep -vE "━|^\s*$" | tail -"${TAIL:-12}" | tee -a "$log"; }

ab() {
  python3 -m pip install -q --no-deps --no-build-isolation --target /tmp/base_site .gpu/base >/dev/null 2>&1 \
    || echo "base tree install failed" | tee -a "$log"
  # NOTE: from /tmp: python3 -m puts the working directory (this tree's graphrt/) first on sys.path
  (cd /tmp && PYTHONPATH=/tmp/base_site:$PYTHONPATH python3 -c "import graphrt; print('base tree', graphrt.__file__)") \
    | tee -a "$log"
  for shape in ${SHAPES:-deepseek-v2-lite qwen3-30b-a3b gpt-oss-20b}; do
    (cd /tmp && PYTHONPATH=/tmp/base_site:$PYTHONPATH LIMIT=80 run python3 -m graphrt bench model --shape "$shape" \
      --batch-sizes 1 --context 512 --iters 30 --no-compile --out "$OUT/json/base")
    LIMIT=120 run graphrt bench model --shape "$shape" --batch-sizes "${BATCHES:-1,16,64}" --context 512 \
      --iters 30 --no-compile --out "$OUT/json"
  done
}

tests() {
  LIMIT=${LIMIT_TESTS:-300} TAIL=20 run python3 -m pytest -q -rf -m gpu -p no:cacheprovider \
    tests/models/test_skinny_fp32.py tests/models/test_router_gemm.py tests/kernels/test_moe_gpu.py \
    tests/kernels/test_moe_experts.py tests/kernels/test_moe_route.py tests/models/test_moe_shared_fusion.py \
    tests/models/test_moe_checkpoints.py tests/runtime/test_mla_runtime.py tests/models/test_mla_prologue_model.py \
    tests/models/test_models_hf_mla.py tests/models/test_prologue_keep.py tests/models/test_prologue.py ${EXTRA_TESTS:-}
}

nopdl() {
  for shape in ${SHAPES:-qwen3-30b-a3b deepseek-v2-lite gpt-oss-20b llama-3.2-1b}; do
    GRAPHRT_PDL=0 LIMIT=80 TAIL=6 run graphrt bench model --shape "$shape" --batch-sizes 1 --context 512 \
      --iters 30 --no-compile --out "$OUT/json/nopdl"
  done
}

case "$what" in
ab) ab ;;
tests) tests ;;
nopdl) nopdl ;;
*) echo "ab|tests|nopdl, got $what" >&2; exit 2 ;;
esac
tar -C "$OUT" -czf "$OUT/s10_${what}_json.tgz" json && rm -rf "$OUT/json"

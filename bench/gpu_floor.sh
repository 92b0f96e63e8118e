#!/usr/bin/env bash
# Decode at the floor, on the GPU machine (after .gpu/install.sh): the step-floor levers measured
# in one call, each with its switch off and on in the same process tree.
#   bash bench/gpu_floor.sh tests|gemm|model|smollm2|prologue|all
# tests: the FA3 plan (backend hooks) against eager and the reference in every graphed mode;
# gemm: the skinny GEMM's GPU tests, `graphrt bench gemm` and its tile sweep;
# model: `graphrt bench model` (SHAPES) with the lever SWITCH off and on;
# smollm2: `graphrt bench overlap` on SmolLM2: tokens/s and wall/busy, greedy and top-p (needs /tmp/models);
# prologue: the fused-prologue GPU tests, then bench model (1B, SmolLM2 shapes) and bench overlap (SmolLM2) at
# bs 1 with GRAPHRT_FUSED_PROLOGUE off and on.
# Logs and JSON go to $OUT.
set -uo pipefail
export PYTHONPATH=/tmp/sglk${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
what=${1:-all}
log="$OUT/floor_$what.log"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || { echo "pip install failed"; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$log"
python3 -c "import torch, triton, sgl_kernel; print('torch', torch.__version__, 'triton', triton.__version__, 'sgl_kernel', sgl_kernel.__version__)" 2>&1 | tee -a "$log"

run_tests() {
  timeout 420 python3 -m pytest -q -x -m gpu -p no:cacheprovider \
    tests/test_backend_hooks.py tests/test_backends.py tests/test_decode_parity.py tests/test_runtime.py \
    tests/test_spec_modes.py tests/test_sliding_window.py tests/test_local_attention.py tests/test_isolation_modes.py \
    2>&1 | tail -25 | tee -a "$log"
}

run_model() {
  # NOTE: SWITCH names the lever compared off (0) and on (1), e.g. GRAPHRT_FA3_PLAN, GRAPHRT_SKINNY_GEMM.
  for shape in ${SHAPES:-llama-3-8b}; do
    for on in ${VALUES:-0 1}; do
      echo "== $shape ${SWITCH:-GRAPHRT_FA3_PLAN}=$on" | tee -a "$log"
      env "${SWITCH:-GRAPHRT_FA3_PLAN}=$on" timeout 240 graphrt bench model --shape "$shape" \
        --batch-sizes "${BATCH_SIZES:-1,16,64}" --context 512 --iters 30 --no-compile --out "$OUT" 2>&1 \
        | tail -20 | tee -a "$log"
    done
  done
}

run_gemm() {
  timeout 200 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/test_skinny.py 2>&1 | tail -5 | tee -a "$log"
  timeout 150 graphrt bench gemm --out "$OUT" 2>&1 | tail -40 | tee -a "$log"
  timeout 200 graphrt bench gemm --sweep --out "$OUT" 2>&1 | tail -40 | tee -a "$log"
}

run_smollm2() {
  gguf=/tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
  for sampled in "" --sampled; do
    echo "== smollm2 $sampled" | tee -a "$log"
    timeout 200 graphrt bench overlap --engine-model "$gguf" $sampled --batch-sizes 1 --context 64 --iters 200 \
      --out "$OUT" 2>&1 | tail -14 | tee -a "$log"
  done
}

run_prologue() {
  timeout 400 python3 -m pytest -q -x -m gpu -p no:cacheprovider -s tests/test_prologue.py tests/test_prologue_model.py \
    tests/test_skinny.py tests/test_decode_parity.py 2>&1 | grep -E "kernels|fused - unfused|passed|failed|Error" | tail -20 | tee -a "$log"
  SWITCH=GRAPHRT_FUSED_PROLOGUE SHAPES="llama-3.2-1b smollm2-shape" BATCH_SIZES=1 run_model
  for on in 0 1; do
    echo "== smollm2 GRAPHRT_FUSED_PROLOGUE=$on" | tee -a "$log"
    GRAPHRT_FUSED_PROLOGUE=$on timeout 200 graphrt bench overlap --engine-model /tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf \
      --batch-sizes 1 --context 64 --iters 200 --out "$OUT" 2>&1 | tail -14 | tee -a "$log"
  done
}

case "$what" in
tests) run_tests ;;
gemm) run_gemm ;;
model) run_model ;;
smollm2) run_smollm2 ;;
prologue) run_prologue ;;
all) run_tests; run_model; run_smollm2 ;;
*) echo "tests|gemm|model|smollm2|prologue|all, got $what" >&2; exit 2 ;;
esac

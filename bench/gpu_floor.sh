#!/usr/bin/env bash
# Decode at the floor, on the GPU machine (after .gpu/install.sh): the step-floor levers measured
# in one call, each with its switch off and on in the same process tree.
#   bash bench/gpu_floor.sh tests|sampler|host|fp8|agreement|gemm|model|smollm2|prologue|all
# tests: the FA3 plan (backend hooks) against eager and the reference in every graphed mode;
# sampler: the fused sampler's GPU tests, `graphrt bench sampler`;
# host: `graphrt bench host` DECODE at 4k and 128k max context;
# fp8: FP8 KV / sinks / page-ownership GPU tests and the 8B FP8-vs-bf16 KV step at 8k;
# agreement: SmolLM2's top-1 agreement with an FP8 KV cache (needs /tmp/models);
# gemm: the skinny GEMM's GPU tests, `graphrt bench gemm` and its tile sweep;
# model: `graphrt bench model` (SHAPES) with the lever SWITCH off and on;
# smollm2: `graphrt bench overlap` on SmolLM2: tokens/s and wall/busy, greedy and top-p (needs /tmp/models);
# prologue: the fused-prologue GPU tests (kernels, models, skinny, decode parity), then bench model
# (Llama-3.2-1B shape, bs 1) and bench overlap (SmolLM2, if present) with GRAPHRT_FUSED_PROLOGUE off and on.
# Logs and JSON go to $OUT.
set -uo pipefail
export PYTHONPATH=/tmp/sglk${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
what=${1:-all}
log="$OUT/floor_$what.log"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || { echo "pip install failed"; exit 1; }
for whl in .gpu/cxxfilt-*.whl; do [ -f "$whl" ] && python3 -m pip install -q --no-deps "$whl" >/dev/null 2>&1; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$log"
python3 -c "import torch, triton, sgl_kernel; print('torch', torch.__version__, 'triton', triton.__version__, 'sgl_kernel', sgl_kernel.__version__)" 2>&1 | tee -a "$log"

run_tests() {
  timeout 420 python3 -m pytest -q -x -m gpu -p no:cacheprovider \
    tests/attention/test_backend_hooks.py tests/attention/test_backends.py tests/runtime/test_decode_parity.py tests/runtime/test_runtime.py \
    tests/runtime/test_spec_modes.py tests/attention/test_sliding_window.py tests/attention/test_local_attention.py tests/kv/test_isolation_modes.py \
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

run_sampler() {
  timeout 200 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/runtime/test_sampler_kernel.py tests/runtime/test_sampler.py \
    tests/tools/test_bench_sampler.py 2>&1 | tail -5 | tee -a "$log"
  timeout 150 graphrt bench sampler --out "$OUT" 2>&1 | tail -30 | tee -a "$log"
}

run_host() {
  timeout 240 graphrt bench host --modes decode --batch-sizes 1,16,64,256 --page-sizes 16 \
    --context-lens 4096,131072 --iters 300 --out "$OUT" 2>&1 | tail -30 | tee -a "$log"
}

run_fp8() {
  timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu $(for n in attention_options option_modes fp8_kv fp8_checkpoint \
    sinks page_ownership; do find tests -name "test_$n.py"; done) 2>&1 | tail -8 | tee -a "$log"
  timeout 200 graphrt bench model --kv-cache-dtype fp8_e4m3 --batch-sizes 1,16,32 --context 8192 --iters 20 --no-compile \
    --out "$OUT" 2>&1 | tail -16 | tee -a "$log"
}

run_agreement() {
  timeout 200 python3 -m graphrt.tools.bench.kv_agreement --device cuda --out "$OUT" 2>&1 | tail -6 | tee -a "$log"
}

run_gemm() {
  timeout 200 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/models/test_skinny.py 2>&1 | tail -5 | tee -a "$log"
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
  timeout 420 python3 -m pytest -q -x -m gpu -p no:cacheprovider -s tests/models/test_prologue.py \
    tests/models/test_prologue_model.py tests/models/test_skinny.py tests/runtime/test_decode_parity.py 2>&1 \
    | grep -E "kernels|passed|failed|Error" | tail -20 | tee -a "$log"
  SWITCH=GRAPHRT_FUSED_PROLOGUE SHAPES=llama-3.2-1b BATCH_SIZES=1 run_model
  gguf=/tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
  [ -f "$gguf" ] || return 0
  for on in 0 1; do
    echo "== smollm2 GRAPHRT_FUSED_PROLOGUE=$on" | tee -a "$log"
    GRAPHRT_FUSED_PROLOGUE=$on timeout 200 graphrt bench overlap --engine-model "$gguf" --batch-sizes 1 \
      --context 64 --iters 200 --out "$OUT" 2>&1 | tail -14 | tee -a "$log"
  done
}

case "$what" in
tests) run_tests ;;
sampler) run_sampler ;;
host) run_host ;;
fp8) run_fp8 ;;
agreement) run_agreement ;;
gemm) run_gemm ;;
model) run_model ;;
smollm2) run_smollm2 ;;
prologue) run_prologue ;;
all) run_tests; run_model; run_smollm2 ;;
*) echo "tests|sampler|host|fp8|agreement|gemm|model|smollm2|prologue|all, got $what" >&2; exit 2 ;;
esac

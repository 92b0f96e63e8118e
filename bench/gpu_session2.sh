#!/usr/bin/env bash
# The GPU checks of the 2026-11-27 work, after .gpu/install.sh (and .gpu/install-model.sh for text):
#   bash bench/gpu_session2.sh tests|floor|text
# tests: the GPU-marked tests of cross-attention, the window pool, the fused prologue, page
#        ownership and damaged files, FP8/sinks and capture accounting;
# floor: `graphrt bench model` on the Llama-3.2-1B shape with GRAPHRT_FUSED_PROLOGUE 0 and 1, the
#        8B shape at bs 1/16/64 with it on, FP8 vs bf16 KV at bs 64 and 8k context (needs an H200's
#        memory), `graphrt bench host` at 4k and 128k;
# text:  bench/gpu_text.sh (generate phases, serve ready, bench serve).
set -uo pipefail
export PYTHONPATH=/tmp/sglk${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
what=${1:?tests|floor|text}
log="$OUT/session2_$what.log"
source bench/gpu_prelude.sh

run_tests() {
  files=$(ls tests/attention/test_cross_attention.py tests/runtime/test_cross.py tests/runtime/test_window_pool.py \
    tests/attention/test_sliding_window.py tests/attention/test_option_modes.py tests/capture/test_capture_accounting.py \
    tests/models/test_prologue.py tests/models/test_prologue_model.py tests/models/test_skinny.py tests/kv/*.py \
    tests/models/test_damaged_files.py tests/engine/test_engine_failures.py 2>/dev/null)
  timeout "${TESTS_LIMIT:-240}" python3 -m pytest -q -rf -m gpu -p no:cacheprovider $files > "$OUT/session2_tests_full.log" 2>&1
  echo "pytest rc=$?" | tee -a "$log"
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/session2_tests_full.log" | tail -30 | tee -a "$log"
}

bench_model() {  # shape batch-sizes context extra-args...
  local shape=$1 bs=$2 ctx=$3
  shift 3
  timeout 150 graphrt bench model --shape "$shape" --batch-sizes "$bs" --context "$ctx" --iters 30 --no-compile \
    --out "$OUT" "$@" 2>&1 | grep -vi "warn" | tail -8 | tee -a "$log"
}

run_floor() {
  for on in 0 1; do
    echo "== llama-3.2-1b GRAPHRT_FUSED_PROLOGUE=$on" | tee -a "$log"
    GRAPHRT_FUSED_PROLOGUE=$on bench_model llama-3.2-1b 1 512
  done
  echo "== llama-3-8b GRAPHRT_FUSED_PROLOGUE=1" | tee -a "$log"
  GRAPHRT_FUSED_PROLOGUE=1 bench_model llama-3-8b 1,16,64 512
  if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    echo "== llama-3-8b fp8_e4m3 vs bf16 KV, bs 64, context 8192" | tee -a "$log"
    bench_model llama-3-8b 64 8192 --kv-cache-dtype fp8_e4m3
  fi
  echo "== bench host" | tee -a "$log"
  timeout 120 graphrt bench host --modes decode --batch-sizes 1,16,64 --page-sizes 16 \
    --context-lens 4096,131072 --iters 200 --out "$OUT" 2>&1 | tail -16 | tee -a "$log"
}

case "$what" in
tests) run_tests ;;
floor) run_floor ;;
text) bash bench/gpu_text.sh ;;
*) echo "tests|floor|text, got $what" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# GPU runs of the 2026-11-29 session (issues 36-40, 42), after .gpu/install.sh (and
# .gpu/install-model.sh for `tests` and `spec`):
#   bash bench/gpu_session8.sh moe|tests|fp8det|spec|suite
# moe:    bench model for the MoE shapes at bs 1 / 16 / 64 (floor = dense + routed experts) and
#         bench moe (the expert kernels alone, skinny vs grouped vs the torch reference).
# tests:  the new GPU-marked tests (MoE kernels and models, FP8, conformance, switches,
#         deterministic SmolLM2), then tests/engine, tests/models, tests/runtime.
# fp8det: bench model with FP8 weights against bf16 (8B and 1B), and deterministic on / off.
# spec:   bench/gpu_spec.sh (bench-spec: copy / chat / always-match against the plain loop).
# suite:  the rest of the GPU-marked tests (attention, buffers, capture, kv, metadata, step, ...).
set -uo pipefail
export PYTHONPATH=/tmp/sglk${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
what=${1:?moe|tests|fp8det|spec|suite}
log="$OUT/s8_$what.log"
source bench/gpu_prelude.sh
mkdir -p "$OUT/json"
run() { echo "== $*" | tee -a "$log"; timeout "${LIMIT:-200}" "$@" 2>&1 | grep -vE "━|^\s*$" | tail -"${TAIL:-12}" | tee -a "$log"; }

moe() {
  for shape in qwen3-30b-a3b gpt-oss-20b deepseek-v2-lite; do
    LIMIT=170 run graphrt bench model --shape "$shape" --batch-sizes 1,16,64 --context 512 --iters 30 \
      --no-compile --out "$OUT/json"
  done
  LIMIT=120 TAIL=30 run graphrt bench moe --device cuda --out "$OUT/json"
}

tests() {
  LIMIT=330 TAIL=25 run python3 -m pytest -q -rf -m gpu -p no:cacheprovider tests/kernels tests/models/test_moe_checkpoints.py \
    tests/models/test_moe_routing.py tests/runtime/test_moe_modes.py tests/test_switches.py \
    tests/attention/test_conformance.py tests/test_llm_red_team.py tests/models/test_invariant_gemm.py tests/test_llm.py
  LIMIT=240 TAIL=25 run python3 -m pytest -q -rf -m gpu -p no:cacheprovider tests/engine tests/models tests/runtime \
    --deselect tests/models/test_moe_checkpoints.py --deselect tests/runtime/test_moe_modes.py
}

fp8det() {
  LIMIT=170 run graphrt bench model --shape llama-3-8b --quantization fp8 --batch-sizes 1,16,64 --context 512 --iters 30 --out "$OUT/json"
  LIMIT=100 run graphrt bench model --shape llama-3.2-1b --quantization fp8 --batch-sizes 1 --context 512 --iters 50 --out "$OUT/json"
  for shape in llama-3.2-1b llama-3-8b; do  # NOTE: --deterministic times both stacks in one run
    LIMIT=150 run graphrt bench model --shape "$shape" --batch-sizes 1,16,64 --context 512 --iters 30 \
      --no-compile --deterministic --out "$OUT/json"
  done
}

spec() { OUT="$OUT/json" LIMIT=560 TAIL=40 run bash bench/gpu_spec.sh; }

suite() {
  LIMIT=560 TAIL=30 run python3 -m pytest -q -rf -m gpu -p no:cacheprovider tests/attention tests/buffers tests/capture \
    tests/kv tests/metadata tests/step tests/debug tests/serve tests/text tests/tools tests/parallel
}

case "$what" in
moe) moe ;;
tests) tests ;;
fp8det) fp8det ;;
spec) spec ;;
suite) suite ;;
*) echo "moe|tests|fp8det|spec|suite, got $what" >&2; exit 2 ;;
esac
tar -C "$OUT" -czf "$OUT/s8_${what}_json.tgz" json && rm -rf "$OUT/json"

#!/usr/bin/env bash
# GPU checks of the 2026-11-27 sessions (third and fourth), after .gpu/install.sh:
#   bash bench/gpu_session4.sh check|ab|levers|engine|tp|repeat|fold|s5|mergecheck|mergebench
# check:  GPU tests of the kernels this session touched: RoPE + KV store folded into the split
#         decode kernel, rope_store with PDL, the one-launch cos/sin, the sampler's layouts,
#         decode parity and the fused prologues (the model level), the token feed.
# ab:     bench model, Llama-3.2-1B (bs 1, 16, 64) and the 8B shape (bs 1, 16, 64) with every
#         kernel on; then at bs 1 each of this session's levers off alone (JSON: ab_json.tgz).
# engine: SmolLM2's overlapped engine (greedy and top-p) and the sampler bench
#         (needs /tmp/models from .gpu/install-model.sh; JSON: engine_json.tgz).
# levers: at bs 1, each of this session's levers off alone (JSON: levers_json.tgz).
# fold:   folded RoPE's GPU tests, then 1B / 8B / SmolLM2 with it off and on.
# repeat: SmolLM2's engine (greedy, top-p) and the 1B step at bs 1, twice each.
# s5:     (fourth session) the decode kernel's and the reworked sampler's GPU tests, the sampler bench,
#         the host path of run(); with the model
#         installed, SmolLM2's engine (greedy, top-p) twice and the 1B / 8B steps at bs 1.
# mergecheck kernels|models: the split decode kernel's GPU tests (both merges), or the model-level
#         ones (decode parity, folded RoPE's model test) with the merge launch
#         (GRAPHRT_DECODE_MERGE_LAST=0; the default merge, the last split's, runs in check).
# mergebench [config...]: for each config (default: all of default launch cap16) the 1B and
#         8B steps at bs 1, context 512, and SmolLM2's engine (with the model installed); JSON:
#         merge_json.tgz. Pass fewer configs per call when a call's time is short.
# tp:     two GPUs (nvidia-h200-x2): TP GPU tests, the 8B step at TP=1 / TP=2, fused prologues off.
set -uo pipefail
export PYTHONPATH=/tmp/sglk${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
what=${1:?check|ab|levers|engine|tp|repeat|fold|s5|mergecheck|mergebench}
log="$OUT/s4_$what.log"
source bench/gpu_prelude.sh
mkdir -p "$OUT/json"

bench_model() {  # shape batch-sizes extra-args...
  local shape=$1 bs=$2
  shift 2
  timeout 200 graphrt bench model --shape "$shape" --batch-sizes "$bs" --context 512 --iters 30 --no-compile \
    --out "$OUT/json" "$@" 2>&1 | grep -vi "warn" | grep -v "━" | tail -"${TAIL:-5}" | tee -a "$log"
}

bench_overlap() {  # SmolLM2's overlapped engine at bs 1 (its table rows); extra-args...
  timeout 200 graphrt bench overlap --engine-model /tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf --batch-sizes 1 \
    --context 64 --iters 200 "$@" --out "$OUT/json" 2>&1 | grep -E "^│" | tee -a "$log"
}

check() {
  timeout 420 python3 -m pytest -q -m gpu -p no:cacheprovider tests/attention/test_decode_rope.py \
    tests/attention/test_decode_kernel.py tests/kv/test_rope_store.py tests/models/test_cos_sin.py \
    tests/runtime/test_sampler_kernel.py tests/runtime/test_decode_rope_model.py tests/runtime/test_decode_parity.py \
    tests/models/test_prologue_model.py tests/runtime/test_feed.py tests/engine/test_overlap.py "$@" 2>&1 | grep -E "passed|failed|FAILED|Error" \
    | tail -20 | tee -a "$log"
}

ab() {
  TAIL=8 bench_model llama-3.2-1b 1,16,64
  TAIL=8 bench_model llama-3-8b 1,16,64
  for flip in GRAPHRT_DECODE_ROPE=1 GRAPHRT_COS_SIN=0; do
    echo "== $flip" | tee -a "$log"
    export "${flip?}"
    TAIL=3 bench_model llama-3.2-1b 1
    TAIL=3 bench_model llama-3-8b 1
    unset "${flip%%=*}"
  done
  tar -C "$OUT" -czf "$OUT/ab_json.tgz" json && rm -rf "$OUT/json"
}

engine() {
  bench_overlap
  bench_overlap --sampled
  echo "== GRAPHRT_FUSED_FEED=0 (the feed's torch ops in the graph)" | tee -a "$log"
  export GRAPHRT_FUSED_FEED=0; bench_overlap; unset GRAPHRT_FUSED_FEED
  echo "== GRAPHRT_DECODE_ROPE=1" | tee -a "$log"
  export GRAPHRT_DECODE_ROPE=1; bench_overlap; unset GRAPHRT_DECODE_ROPE
  timeout 200 graphrt bench sampler --batch-sizes 1,8,64 --out "$OUT/json" 2>&1 | grep -v "━" | tail -14 | tee -a "$log"
  tar -C "$OUT" -czf "$OUT/engine_json.tgz" json && rm -rf "$OUT/json"
}

levers() {  # bs 1 only: each lever off alone, then all on
  for off in GRAPHRT_DECODE_ROPE GRAPHRT_COS_SIN GRAPHRT_DECODE_ATTENTION NONE; do
    echo "== $off=0" | tee -a "$log"
    export "$off=0"
    TAIL=3 bench_model llama-3-8b 1
    TAIL=3 bench_model llama-3.2-1b 1
    unset "$off"
  done
  tar -C "$OUT" -czf "$OUT/levers_json.tgz" json && rm -rf "$OUT/json"
}

tp() {  # two GPUs: TP GPU tests, then the 8B-shape step at TP=1 and TP=2 (fused prologues on, then off)
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
  timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/parallel/test_tp_gpu.py 2>&1 | tail -3 | tee -a "$log"
  local tp1="$OUT/json/tp1" tp2="$OUT/json/tp2" off="$OUT/json/tp2_prologue_off"
  mkdir -p "$tp1" "$tp2" "$off"
  timeout 150 python3 -m graphrt.tools.bench.tp --tp 1 --batch-sizes 1,16 --out "$tp1" 2>&1 | grep -vi warn | tail -4 | tee -a "$log"
  timeout 150 torchrun --nproc-per-node 2 -m graphrt.tools.bench.tp --tp 2 --batch-sizes 1,16 --out "$tp2" 2>&1 \
    | grep -vi warn | tail -4 | tee -a "$log"
  GRAPHRT_FUSED_PROLOGUE=0 timeout 150 torchrun --nproc-per-node 2 -m graphrt.tools.bench.tp --tp 2 --batch-sizes 1 \
    --out "$off" 2>&1 | grep -vi warn | tail -4 | tee -a "$log"
  tar -C "$OUT" -czf "$OUT/tp_json.tgz" json && rm -rf "$OUT/json"
}

repeat() {  # the SmolLM2 engine target and the 1B step again, twice each (run-to-run spread)
  for _ in 1 2; do
    bench_overlap
    bench_overlap --sampled
    TAIL=3 bench_model llama-3.2-1b 1
  done
  tar -C "$OUT" -czf "$OUT/repeat_json.tgz" json && rm -rf "$OUT/json"
}

fold() {  # folded RoPE (halves): its GPU tests, then 1B / 8B / SmolLM2 with GRAPHRT_DECODE_ROPE=0 and 1
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/attention/test_decode_rope.py \
    tests/runtime/test_decode_rope_model.py 2>&1 | grep -E "passed|failed|FAILED" | tail -6 | tee -a "$log"
  for on in 0 1; do
    echo "== GRAPHRT_DECODE_ROPE=$on" | tee -a "$log"
    export GRAPHRT_DECODE_ROPE=$on
    TAIL=2 bench_model llama-3.2-1b 1
    TAIL=2 bench_model llama-3-8b 1
    bench_overlap
  done
  unset GRAPHRT_DECODE_ROPE
  tar -C "$OUT" -czf "$OUT/fold_json.tgz" json && rm -rf "$OUT/json"
}

s5() {
  timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/attention/test_decode_attend.py \
    tests/attention/test_decode_kernel.py tests/runtime/test_decode_parity.py tests/runtime/test_sampler_kernel.py \
    tests/runtime/test_sampler.py tests/tools/test_bench_sampler.py tests/engine/test_sampling.py 2>&1 \
    | grep -E "passed|failed|FAILED|^E " | head -30 | tee -a "$log"
  timeout 200 graphrt bench sampler --batch-sizes 1,8,64 --vocabs 49152,128256 --out "$OUT/json" 2>&1 | grep -v "━" \
    | tail -16 | tee -a "$log"
  timeout 200 graphrt bench host --device cuda --modes decode --page-sizes 1,16 --context-lens 4096,131072 \
    --batch-sizes 1,16,64,256 --iters 200 --out "$OUT/json" 2>&1 | grep -E "^│|^┃" | tee -a "$log"
  if [ -f /tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf ]; then
    for _ in 1 2; do bench_overlap; bench_overlap --sampled; done
  fi
  TAIL=2 bench_model llama-3.2-1b 1
  TAIL=2 bench_model llama-3-8b 1
  tar -C "$OUT" -czf "$OUT/s5_json.tgz" json && rm -rf "$OUT/json"
}

mergecheck() {  # kernels | models (each under the 10-minute call limit)
  if [ "${1:-kernels}" = kernels ]; then
    timeout 540 python3 -m pytest -q -m gpu -p no:cacheprovider tests/attention/test_decode_merge.py \
      tests/attention/test_decode_kernel.py tests/attention/test_decode_attend.py 2>&1 \
      | grep -E "passed|failed|FAILED|^E " | head -30 | tee -a "$log"
    return
  fi
  echo "== GRAPHRT_DECODE_MERGE_LAST=0" | tee -a "$log"
  GRAPHRT_DECODE_MERGE_LAST=0 timeout 270 python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/runtime/test_decode_parity.py tests/runtime/test_decode_rope_model.py 2>&1 \
    | grep -E "passed|failed|FAILED|^E " | head -20 | tee -a "$log"
}

#: The merges mergebench compares: name -> the switches it sets.
declare -A MERGES=(
  [default]=""
  [launch]="GRAPHRT_DECODE_MERGE_LAST=0"
  [cap16]="GRAPHRT_DECODE_MAX_SPLITS=16"
)

mergebench() {  # config names (default: every one in MERGES' order below)
  local configs=("$@")
  [ ${#configs[@]} -eq 0 ] && configs=(default launch cap16)
  for name in "${configs[@]}"; do
    [ -n "${MERGES[$name]+x}" ] || { echo "unknown merge config $name" | tee -a "$log"; continue; }
    echo "== $name: ${MERGES[$name]:-(no switch)}" | tee -a "$log"
    (
      for kv in ${MERGES[$name]}; do export "${kv?}"; done
      TAIL=3 bench_model llama-3.2-1b 1
      TAIL=3 bench_model llama-3-8b 1
      if [ -f /tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf ]; then bench_overlap; fi
    )
  done
  tar -C "$OUT" -czf "$OUT/merge_json.tgz" json && rm -rf "$OUT/json"
}

case "$what" in
mergecheck) shift; mergecheck "$@" ;;
mergebench) shift; mergebench "$@" ;;
s5) s5 ;;
fold) fold ;;
repeat) repeat ;;
check) shift; check "$@" ;;
tp) tp ;;
ab) ab ;;
levers) levers ;;
engine) engine ;;
*) echo "check|ab|levers|engine|tp|repeat|fold|s5|mergecheck|mergebench, got $what" >&2; exit 2 ;;
esac

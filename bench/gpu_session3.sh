#!/usr/bin/env bash
# GPU checks of the 2026-11-27 (second) session, after .gpu/install.sh:
#   bash bench/gpu_session3.sh explore|sweep|tiles|floor|decode|rope
# explore: FA3 num_splits 0/1/2/4/8 on the Llama-3.2-1B shape at bs 1; the 8B shape with the
#          fused prologue off and on; run() host profiles with real replays.
# sweep:   `bench gemm --sweep` at M = 1 (skinny and fused prologue tiles), FA3 splits auto vs 0,
#          `bench sampler`.
# tiles:   GPU tests of the GEMM kernels and FA3's plan, then the model bench with the new tiles,
#          the fused prologue off, PDL off.
# floor:   the final step-floor benches (JSON tarred into floor_json.tgz), SmolLM2's overlap bench
#          when /tmp/models holds it, `bench host`.
# decode:  the split decode attention kernel: GPU tests of attention and decode parity, then the
#          model bench with GRAPHRT_DECODE_ATTENTION on and off (JSON in decode_json.tgz).
# rope:    RoPE + KV store folded into the split decode kernel: its GPU tests (and the decode
#          parity with it off), then the model bench with GRAPHRT_DECODE_ROPE on and off.
set -uo pipefail
export PYTHONPATH=/tmp/sglk${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
what=${1:?explore|sweep|tiles|floor|decode|rope}
log="$OUT/s3_$what.log"
source bench/gpu_prelude.sh

bench_model() {  # shape batch-sizes context extra-args...
  local shape=$1 bs=$2 ctx=$3
  shift 3
  timeout 200 graphrt bench model --shape "$shape" --batch-sizes "$bs" --context "$ctx" --iters 30 --no-compile \
    --out "$OUT/json" "$@" 2>&1 | grep -vi "warn" | grep -v "━" | tail -${TAIL:-5} | tee -a "$log"
}

explore() {
  mkdir -p "$OUT/json"
  for s in 0 1 2 4 8; do
    echo "== 1b bs1 ctx512 GRAPHRT_FA3_NUM_SPLITS=$s" | tee -a "$log"
    GRAPHRT_FA3_NUM_SPLITS=$s bench_model llama-3.2-1b 1 512
  done
  for p in 0 1; do
    echo "== 8b GRAPHRT_FUSED_PROLOGUE=$p" | tee -a "$log"
    TAIL=7 GRAPHRT_FUSED_PROLOGUE=$p bench_model llama-3-8b 1,16 512
  done
  echo "== 8b bs1,16 FA3 splits 4 prologue 0" | tee -a "$log"
  TAIL=7 GRAPHRT_FUSED_PROLOGUE=0 GRAPHRT_FA3_NUM_SPLITS=4 bench_model llama-3-8b 1,16 512
  for args in "1 4096" "64 4096" "1 131072"; do
    echo "== host profile $args" | tee -a "$log"
    timeout 120 python3 bench/gpu_host_profile.py $args 2>&1 | head -45 | tee -a "$log"
  done
  echo "== bench host --profile (stubbed)" | tee -a "$log"
  timeout 120 graphrt bench host --profile --device cuda --modes decode --batch-sizes 1,64 --page-sizes 16 \
    --context-lens 4096 --iters 200 --profile-top 0 2>&1 | tail -20 | tee -a "$log"
}

sweep() {  # tiles of the fused prologue and the skinny GEMM; FA3 splits auto vs FA3's heuristic
  mkdir -p "$OUT/json"
  timeout 240 graphrt bench gemm --sweep --batch-sizes 1 --iters 30 --out "$OUT/json" 2>&1 | grep -v "━" | tail -20 | tee -a "$log"
  for s in auto 0; do
    echo "== GRAPHRT_FA3_NUM_SPLITS=$s" | tee -a "$log"
    TAIL=6 GRAPHRT_FA3_NUM_SPLITS=$s bench_model llama-3-8b 1,16,64 512
    TAIL=6 GRAPHRT_FA3_NUM_SPLITS=$s bench_model llama-3.2-1b 1,16,64 512
  done
  timeout 120 graphrt bench sampler --out "$OUT/json" 2>&1 | grep -v "━" | tail -24 | tee -a "$log"
}

tiles() {  # the new tiles and FA3 splits: tests, then the model bench with the levers on and off
  mkdir -p "$OUT/json"
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/models/test_skinny.py tests/models/test_prologue.py \
    tests/models/test_prologue_model.py tests/attention/test_backends.py tests/attention/test_backend_hooks.py 2>&1 | tail -4 | tee -a "$log"
  echo "== levers on (default)" | tee -a "$log"
  TAIL=6 bench_model llama-3.2-1b 1,16,64 512
  TAIL=6 bench_model llama-3-8b 1,16,64 512
  echo "== GRAPHRT_FUSED_PROLOGUE=0" | tee -a "$log"
  TAIL=3 GRAPHRT_FUSED_PROLOGUE=0 bench_model llama-3.2-1b 1 512
  TAIL=3 GRAPHRT_FUSED_PROLOGUE=0 bench_model llama-3-8b 1 512
  echo "== PDL off (GRAPHRT_PDL=0 GRAPHRT_PDL=0)" | tee -a "$log"
  TAIL=3 GRAPHRT_PDL=0 GRAPHRT_PDL=0 bench_model llama-3.2-1b 1 512
}

floor() {  # the step-floor benches, levers on (JSON with PDL edges, anchors, targets); PDL off; SmolLM2
  mkdir -p "$OUT/json"
  echo "== levers on" | tee -a "$log"
  TAIL=8 bench_model llama-3.2-1b 1,16,64 512
  TAIL=8 bench_model llama-3-8b 1,16,64 512
  echo "== PDL off (GRAPHRT_PDL=0 GRAPHRT_PDL=0)" | tee -a "$log"
  TAIL=3 GRAPHRT_PDL=0 GRAPHRT_PDL=0 bench_model llama-3.2-1b 1 512
  TAIL=3 GRAPHRT_PDL=0 GRAPHRT_PDL=0 bench_model llama-3-8b 1 512
  gguf=/tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
  if [ -f "$gguf" ]; then
    for sampled in "" --sampled; do
      echo "== smollm2 overlap $sampled" | tee -a "$log"
      timeout 200 graphrt bench overlap --engine-model "$gguf" $sampled --batch-sizes 1 --context 64 --iters 200 \
        --out "$OUT/json" 2>&1 | grep -v "━" | tail -12 | tee -a "$log"
    done
  fi
  timeout 120 graphrt bench host --modes decode --batch-sizes 1,16,64 --page-sizes 16 \
    --context-lens 4096,131072 --iters 200 --out "$OUT/json" 2>&1 | grep -v "━" | tail -16 | tee -a "$log"
  tar -C "$OUT" -czf "$OUT/floor_json.tgz" json && rm -rf "$OUT/json"
}

decode() {  # the split decode attention kernel: tests, then the model bench with it on and off
  mkdir -p "$OUT/json"
  timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/attention tests/runtime/test_decode_parity.py \
    tests/models/test_prologue_model.py 2>&1 | grep -E "passed|failed|FAILED|Error" | tail -12 | tee -a "$log"
  for on in 1 0; do
    echo "== GRAPHRT_DECODE_ATTENTION=$on" | tee -a "$log"
    TAIL=6 GRAPHRT_DECODE_ATTENTION=$on bench_model llama-3.2-1b 1,16,64 512
    TAIL=6 GRAPHRT_DECODE_ATTENTION=$on bench_model llama-3-8b 1,16,64 512
  done
  tar -C "$OUT" -czf "$OUT/decode_json.tgz" json && rm -rf "$OUT/json"
}

rope() {  # RoPE + KV store folded into the split decode kernel: tests, then the bench on and off
  mkdir -p "$OUT/json"
  timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/attention/test_decode_rope.py \
    tests/attention/test_decode_kernel.py tests/kv/test_rope_store.py tests/runtime/test_decode_rope_model.py \
    tests/runtime/test_decode_parity.py 2>&1 | grep -E "passed|failed|FAILED|Error" | tail -12 | tee -a "$log"
  GRAPHRT_DECODE_ROPE=0 timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/runtime/test_decode_parity.py \
    2>&1 | tail -2 | tee -a "$log"
  for on in 1 0; do
    echo "== GRAPHRT_DECODE_ROPE=$on" | tee -a "$log"
    TAIL=6 GRAPHRT_DECODE_ROPE=$on bench_model llama-3.2-1b 1,16,64 512
    TAIL=6 GRAPHRT_DECODE_ROPE=$on bench_model llama-3-8b 1,16 512
  done
  tar -C "$OUT" -czf "$OUT/rope_json.tgz" json && rm -rf "$OUT/json"
}

case "$what" in
explore) explore ;;
decode) decode ;;
rope) rope ;;
floor) floor ;;
tiles) tiles ;;
sweep) sweep ;;
*) echo "explore|sweep|tiles|floor|decode|rope, got $what" >&2; exit 2 ;;
esac

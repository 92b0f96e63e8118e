#!/usr/bin/env bash
# GPU checks of the 2026-11-27 fifth session, after .gpu/install.sh:
#   bash bench/gpu_session5.sh check|probe|models|sweep|ssweep|fold|hostprof|ab <GRAPHRT_SKINNY_TILES spec>
# probe:  where the fused sampler's time goes (bench/debug/sampler_kernels.py: each kernel's
#         duration at bs 1, 49k / 128k, greedy / top-p, PDL on / off), then the host path of
#         run() on this host (bench host --profile, ps 1, ctx 4096) and per context
#         (4k vs 128k interleaved, bench/host_contexts).
# models: bench model, Llama-3.2-1B and the 8B shape at bs 1, 16, 64 with the default levers.
# check:  after the sampler's one-pass tally and the merge by the last split became defaults: their
#         GPU tests (sampler, split decode with both merges, decode parity, prologue GEMMs), the
#         sampler's per-kernel durations, and the 1B / 8B steps at bs 1.
# sweep:  (next) bench gemm --sweep at M 16 and 64: the skinny GEMM's pipelined tiles (stages > 1)
#         against cuBLAS, to decide whether steps of 2-64 rows take it (ops.SKINNY_MAX_M).
# ssweep: (next) the sampler's layouts at bs 1 (bench sampler --sweep: scan_warps apart, tally 4 with
#         the row sums by atomics) and the sampler bench.
# fold:   (next) RoPE + KV store folded into the split decode kernel (GRAPHRT_DECODE_ROPE=0 / 1)
#         now that the split launch also merges: 1B / 8B at bs 1 (and SmolLM2's engine if installed).
# hostprof: (next) run()'s host phases on this host with the whole cProfile listing in a file
#         (the probe's table left 22 us of "run - phases" unexplained).
# ab:     (sixth session) 1B / 8B at bs 16 and 64: the default (cuBLAS above one row) against
#         GRAPHRT_SKINNY_MAX_M=64 with the tiles of $2 (bench/debug/pick_tiles.py on the sweep's JSON).
set -uo pipefail
export PYTHONPATH=/tmp/sglk${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
what=${1:?check|probe|models|sweep|ssweep|fold|hostprof|ab}
log="$OUT/s5_$what.log"
source bench/gpu_prelude.sh
mkdir -p "$OUT/json"

probe() {
  timeout 200 python3 bench/debug/sampler_kernels.py --json "$OUT/json/sampler_kernels.json" 2>&1 | grep -v Warn | tee -a "$log"
  timeout 150 graphrt bench host --device cuda --modes decode --page-sizes 1 --context-lens 4096 --batch-sizes 1,16,64 \
    --profile --profile-top 25 2>&1 | tail -70 | tee -a "$log"
  timeout 200 graphrt bench host --device cuda --modes decode --page-sizes 1,16 --context-lens 4096,131072 \
    --batch-sizes 1,16,64,256 --iters 200 --out "$OUT/json" 2>&1 | grep -E "^│|^┃|ratio|written" | tee -a "$log"
}

models() {
  for shape in llama-3.2-1b llama-3-8b; do
    timeout 250 graphrt bench model --shape "$shape" --batch-sizes 1,16,64 --context 512 --iters 30 --no-compile \
      --out "$OUT/json" 2>&1 | grep -vi "warn" | grep -v "━" | tail -12 | tee -a "$log"
  done
}

check() {
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/runtime/test_sampler_kernel.py \
    tests/runtime/test_sampler.py tests/attention/test_decode_merge.py tests/attention/test_decode_attend.py \
    tests/runtime/test_decode_parity.py tests/models/test_prologue.py 2>&1 | grep -E "passed|failed|FAILED|^E " \
    | head -30 | tee -a "$log"
  timeout 90 python3 bench/debug/sampler_kernels.py --json "$OUT/json/sampler_kernels.json" 2>&1 | grep -v Warn \
    | tee -a "$log"
  for shape in llama-3.2-1b llama-3-8b; do
    timeout 100 graphrt bench model --shape "$shape" --batch-sizes 1 --context 512 --iters 30 --no-compile \
      --out "$OUT/json" 2>&1 | grep -vi "warn" | grep -v "━" | tail -6 | tee -a "$log"
  done
}

sweep() {
  timeout 540 graphrt bench gemm --sweep --batch-sizes 16,64 --out "$OUT/json" > "$OUT/gemm_sweep.txt" 2>&1
  grep -v "━" "$OUT/gemm_sweep.txt" | tail -30 | tee -a "$log"
  python3 bench/debug/pick_tiles.py "$OUT"/json/gemm_cuda_*.json | tee -a "$log"
}

ab() {
  local tiles=${1:?the GRAPHRT_SKINNY_TILES spec}
  for mode in cublas skinny; do
    echo "== $mode (tiles $tiles)" | tee -a "$log"
    for shape in llama-3.2-1b llama-3-8b; do
      if [ $mode = skinny ]; then export GRAPHRT_SKINNY_MAX_M=64 GRAPHRT_SKINNY_TILES=$tiles; fi
      timeout 140 graphrt bench model --shape "$shape" --batch-sizes 16,64 --context 512 --iters 30 --no-compile \
        --out "$OUT/json" 2>&1 | grep -vi "warn" | grep -v "━" | tail -5 | tee -a "$log"
      unset GRAPHRT_SKINNY_MAX_M GRAPHRT_SKINNY_TILES
    done
  done
}

hostprof() {
  timeout 200 graphrt bench host --device cuda --modes decode --page-sizes 1 --context-lens 4096 --batch-sizes 1,64 \
    --profile --profile-top 40 > "$OUT/host_profile.txt" 2>&1
  grep -A14 "phase" "$OUT/host_profile.txt" | tee -a "$log"
}

fold() {
  for on in 0 1; do
    echo "== GRAPHRT_DECODE_ROPE=$on" | tee -a "$log"
    for shape in llama-3.2-1b llama-3-8b; do
      GRAPHRT_DECODE_ROPE=$on timeout 100 graphrt bench model --shape "$shape" --batch-sizes 1 --context 512 \
        --iters 30 --no-compile --out "$OUT/json" 2>&1 | grep -vi "warn" | grep -v "━" | tail -3 | tee -a "$log"
    done
    if [ -f /tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf ]; then
      GRAPHRT_DECODE_ROPE=$on timeout 200 graphrt bench overlap --engine-model /tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf \
        --batch-sizes 1 --context 64 --iters 200 --out "$OUT/json" 2>&1 | grep -E "^│" | tee -a "$log"
    fi
  done
}

ssweep() {
  timeout 400 graphrt bench sampler --sweep --batch-sizes 1 --vocabs 49152,128256 --out "$OUT/json" 2>&1 \
    | grep -v "━" | tail -40 | tee -a "$log"
  timeout 120 python3 bench/debug/sampler_kernels.py --json "$OUT/json/sampler_kernels.json" 2>&1 | grep -v Warn \
    | tee -a "$log"
}

case "$what" in
ssweep) ssweep ;;
ab) ab "${2:-}" ;;
fold) fold ;;
sweep) sweep ;;
hostprof) hostprof ;;
check) check ;;
probe) probe ;;
models) models ;;
*) echo "check|probe|models|sweep|ssweep|fold|hostprof|ab, got $what" >&2; exit 2 ;;
esac
tar -C "$OUT" -czf "$OUT/s5_${what}_json.tgz" json && rm -rf "$OUT/json"

#!/usr/bin/env bash
# GPU checks of the 2026-11-27 seventh session (issue 25's last measurements), after .gpu/install.sh
# (and .gpu/install-model.sh for `engine`):
#   bash bench/gpu_session7.sh engine|splits|host
# engine: SmolLM2 in Engine.generate's step loop at bs 1, greedy and seeded top-p (bench overlap:
#         tokens/s, wall / GPU busy, overlap off vs on).
# splits: the split decode kernel's split count capped (GRAPHRT_DECODE_MAX_SPLITS unset, 16, 8, 4):
#         1B and 8B at bs 1, context 512.
# host:   run()'s host time with the real replay, bs 1, 16, 64, page sizes 1 and 16, contexts 4k and
#         128k (samples interleaved: the widest / narrowest ratio).
set -uo pipefail
export PYTHONPATH=/tmp/sglk${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
what=${1:?engine|splits|host}
log="$OUT/s7_$what.log"
source bench/gpu_prelude.sh
mkdir -p "$OUT/json"
model=/tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf

engine() {
  for sampled in "" --sampled; do
    echo "== ${sampled:-greedy}" | tee -a "$log"
    timeout 200 graphrt bench overlap --engine-model "$model" --batch-sizes 1 --context 64 --iters 200 $sampled \
      --out "$OUT/json" 2>&1 | grep -E "^│|^┃|tok|written" | tee -a "$log"
  done
}

splits() {
  for cap in "" 16 8 4; do
    echo "== GRAPHRT_DECODE_MAX_SPLITS=${cap:-unset}" | tee -a "$log"
    for shape in llama-3.2-1b llama-3-8b; do
      GRAPHRT_DECODE_MAX_SPLITS=$cap timeout 100 graphrt bench model --shape "$shape" --batch-sizes 1 \
        --context 512 --iters 30 --no-compile --out "$OUT/json" 2>&1 | grep -vi "warn" | grep -v "━" | tail -3 \
        | tee -a "$log"
    done
  done
}

host() {
  timeout 280 graphrt bench host --device cuda --modes decode --page-sizes 1,16 --context-lens 4096,131072 \
    --batch-sizes 1,16,64 --iters 200 --out "$OUT/json" 2>&1 | grep -E "^│|^┃|ratio|written" | tee -a "$log"
}

case "$what" in
engine) engine ;;
splits) splits ;;
host) host ;;
*) echo "engine|splits|host, got $what" >&2; exit 2 ;;
esac
tar -C "$OUT" -czf "$OUT/s7_${what}_json.tgz" json && rm -rf "$OUT/json"

#!/usr/bin/env bash
# GPU runs of 2026-12-07 (sixth session), after .gpu/install.sh (and .gpu/install-model.sh for smol):
#   bash bench/gpu_session12.sh tune|sampler|bench|smol|verify
# tune:    the MoE kernels' GPU tests, then `graphrt tune --only moe` over the MoE presets (experts'
#          up, down, split and grouped tiles) into this GPU's cached table, copied to $OUT.
# sampler: `graphrt bench sampler --sweep` (the fused sampler's layouts on this GPU).
# bench:   the GPU tests of the fused RoPE store (chunked-local fix) and the split sampler graph
#          (TESTS), then bench model of the MoE shapes at BATCHES with the tuned table (the cache)
#          and the committed one (GRAPHRT_CACHE=0), then the dense shapes with the committed table.
# smol:    SmolLM2's overlapped engine at bs 1, serve plain / top-5 logprobs / JSON schema at
#          SERVE_CLIENTS, bench-spec copy / chat at 4 and 8 drafted tokens (median of 3 generates).
# verify:  per-kernel device µs of SmolLM2's bs-1 TARGET_VERIFY and DECODE graphs, speculative
#          engine beside plain (bench/debug/verify_kernels.py), after the model parts.
set -uo pipefail
export PYTHONPATH=/tmp/sglk${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 XDG_CACHE_HOME=/tmp/xdg
what=${1:?tune|sampler|bench|smol|verify}
log="$OUT/s12_$what.log"
gguf=/tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
source bench/gpu_prelude.sh
mkdir -p "$OUT/json"
run() { echo "== $*" | tee -a "$log"; timeout "${LIMIT:-200}" "$@" 2>&1 | grep -vE "━|^\s*$" | tail -"${TAIL:-12}" | tee -a "$log"; }
moe_shapes="qwen3-30b-a3b gpt-oss-20b deepseek-v2-lite"

tune() {
  LIMIT=150 TAIL=8 run python3 -m pytest -q -rf -m gpu -p no:cacheprovider tests/kernels/test_moe_experts.py \
    tests/kernels/test_tuning.py
  LIMIT=${LIMIT_TUNE:-330} TAIL=40 run graphrt tune --models "${moe_shapes// /,}" --only moe --iters ${ITERS:-30}
  cp -r /tmp/xdg/graphrt/tuning "$OUT/" 2>/dev/null
}

sampler() {
  LIMIT=200 TAIL=40 run graphrt bench sampler --sweep --out "$OUT/json"
}

bench() {
  LIMIT=${LIMIT_TESTS:-150} TAIL=15 run python3 -m pytest -q -rf -m gpu -p no:cacheprovider ${TESTS:-}
  for shape in ${SHAPES:-$moe_shapes}; do
    for cache in 1 0; do
      GRAPHRT_CACHE=$cache LIMIT=80 TAIL=10 run graphrt bench model --shape "$shape" --batch-sizes "${BATCHES:-1,16,64}" \
        --context 512 --iters 30 --no-compile --out "$OUT/json/cache$cache"
    done
  done
  for shape in ${DENSE:-llama-3.2-1b llama-3-8b}; do
    GRAPHRT_CACHE=0 LIMIT=80 TAIL=10 run graphrt bench model --shape "$shape" --batch-sizes "${BATCHES:-1,16,64}" \
      --context 512 --iters 30 --no-compile --out "$OUT/json/cache0"
  done
}

smol() {
  LIMIT=100 run graphrt bench overlap --engine-model "$gguf" --batch-sizes 1 --context 64 --iters 200 --out "$OUT/json"
  local schema='{"response_format":{"type":"json_schema","json_schema":{"name":"answer","schema":{"type":"object","properties":{"answer":{"type":"string"},"steps":{"type":"array","items":{"type":"string"}}},"required":["answer","steps"]}}}}'
  for body in '{}' '{"logprobs":true,"top_logprobs":5}' "$schema"; do
    LIMIT=70 run graphrt bench serve --model "$gguf" --device cuda --peer none --concurrency "${SERVE_CLIENTS:-1,8,32}" \
      --body "$body" --out "$OUT/json"
  done
  for steps in ${SPEC_STEPS:-4 8}; do
    for workload in copy chat; do
      LIMIT=80 run graphrt bench-spec --target "$gguf" --workload "$workload" --method ngram,suffix --topk 1 \
        --batch-sizes 1 --num-steps "$steps" --device cuda --max-new-tokens 256 --context 1024 --repeats 3 \
        --out "$OUT/json"
    done
  done
}

verify() {
  LIMIT=120 TAIL=60 run python3 bench/debug/verify_kernels.py "$gguf" 4 20
}

case "$what" in
tune) tune ;;
verify) verify ;;
sampler) sampler ;;
bench) bench ;;
smol) smol ;;
*) echo "tune|sampler|bench|smol|verify, got $what" >&2; exit 2 ;;
esac
tar -C "$OUT" -czf "$OUT/s12_${what}_json.tgz" json && rm -rf "$OUT/json"

#!/usr/bin/env bash
# GPU runs of the open issues (37, 38, 39, 42, 43; since 2026-12-06), after .gpu/install.sh (and
# .gpu/install-model.sh for `spec` and `engine`):
#   bash bench/gpu_session9.sh moe|dense|spec|engine|moetune|suite|tuneall|kernels|tunedense|newtests|benchall|short
# moe:    bench model for the MoE shapes at bs 1 / 16 / 64 with the fused router (floor = dense +
#         routed experts; the device profile per batch size is in each JSON), then `graphrt tune`
#         (this GPU's table into $XDG_CACHE_HOME, copied to $OUT; TUNE=0 skips it;
#         SHAPES="a b" bench only those).
# dense:  bench model for 1B and 8B at bs 1 / 16 / 64, the committed table (GRAPHRT_CACHE=0) and
#         then the tuned one, in one call; FP8 weights against bf16 for 8B.
# spec:   bench-spec, ngram / suffix chains with overlap on and off against the overlapped
#         plain loop: copy and chat at bs 1, back-off at bs 32 / 64, the 8B always-match ceiling.
# engine: first answer (lazy vs eager capture), chunked prefill ITL, prefix caching (64 requests
#         sharing 1000 tokens), graphrt serve plain / logprobs / JSON schema at 1 / 8 / 32 clients.
# tunedense: `graphrt tune` of every preset into graphrt/kernels/tables/<GPU>.json (copied to $OUT).
# newtests: the GPU tests of prefill graphs, FP8 prefix hits and MIXED extras.
# short: newtests, then `graphrt tune` of the dense presets' GEMMs and decode (what a short lease fits).
# benchall: bench model of every preset (SHAPES) at BATCHES with the table in place.
# kernels: the GPU tests of the kernels new this session and the last (MLA prologue, MoE experts).
# suite:  the whole GPU-marked suite (the fused MLA prologue's tests first).
# tuneall: `graphrt tune` over the dense and MoE presets (this GPU's table, copied to $OUT), then
#         bench model of every preset (SHAPES) at bs 1 / 16 / 64 (BATCHES), committed table (GRAPHRT_CACHE=0) then tuned.
# moetune: the new GPU tests, `graphrt tune` over the dense and MoE presets (experts too), then
#         bench model bs 1 of each MoE shape with the committed table and with the tuned one.
set -uo pipefail
export PYTHONPATH=/tmp/sglk${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 XDG_CACHE_HOME=/tmp/xdg
what=${1:?moe|dense|spec|engine|moetune|suite|tuneall|kernels|tunedense|newtests|benchall|short}
log="$OUT/s9_$what.log"
gguf=/tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
source bench/gpu_prelude.sh
mkdir -p "$OUT/json"
run() { echo "== $*" | tee -a "$log"; timeout "${LIMIT:-200}" "$@" 2>&1 | grep -vE "━|^\s*$" | tail -"${TAIL:-12}" | tee -a "$log"; }
table=/tmp/xdg/graphrt/tuning/$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr " " _).json

moe() {
  for shape in ${SHAPES:-gpt-oss-20b deepseek-v2-lite qwen3-30b-a3b}; do
    LIMIT=140 run graphrt bench model --shape "$shape" --batch-sizes 1,16,64 --context 512 --iters 30 \
      --no-compile --out "$OUT/json"
  done
  [ "${TUNE:-1}" = 1 ] && LIMIT=170 TAIL=30 run graphrt tune --iters 50
  cp -r /tmp/xdg/graphrt/tuning "$OUT/" 2>/dev/null
}

dense() {
  for shape in llama-3.2-1b llama-3-8b; do
    GRAPHRT_CACHE=0 LIMIT=90 run graphrt bench model --shape "$shape" --batch-sizes 1,16,64 --context 512 \
      --iters 30 --no-compile --out "$OUT/json"
    [ -f "$table" ] && LIMIT=90 run graphrt bench model --shape "$shape" --batch-sizes 1,16,64 --context 512 \
      --iters 30 --no-compile --out "$OUT/json"
  done
  LIMIT=100 run graphrt bench model --shape llama-3-8b --quantization fp8 --batch-sizes 1 --context 512 --iters 30 \
    --out "$OUT/json"
}

spec() {
  local common=(--device cuda --max-new-tokens 256 --context 1024 --spec-overlap both --out "$OUT/json")
  for steps in 4 8; do
    for workload in copy chat; do
      LIMIT=100 run graphrt bench-spec --target "$gguf" --workload "$workload" --method ngram,suffix --topk 1 \
        --batch-sizes 1 --num-steps "$steps" "${common[@]}"
    done
  done
  LIMIT=100 run graphrt bench-spec --target "$gguf" --workload chat --method ngram --batch-sizes 32,64 \
    --disable-batch-size 16 --num-steps 4 "${common[@]}"
  LIMIT=100 run graphrt bench-spec --target llama-3-8b --workload always-match --method ngram --batch-sizes 1 \
    --num-steps 4 --max-new-tokens 128 --context 512 --spec-overlap both --device cuda --out "$OUT/json"
}

engine() {
  LIMIT=120 TAIL=20 run graphrt bench first-answer --model "$gguf" --runs 3 --out "$OUT/json"
  for chunk in ${CHUNKS:-512 256}; do
    LIMIT=90 TAIL=40 run python3 -m graphrt.tools.bench.chunked --model "$gguf" --device cuda --chunk "$chunk" \
      --profile 14 --out "$OUT/json"
  done
  for graphs in 0 4096; do
    LIMIT=90 run graphrt bench prefix --model "$gguf" --requests 64 --system-tokens 1000 --user-tokens 24 \
      --new-tokens 32 --device cuda --prefill-graph-tokens "$graphs" --out "$OUT/json"
  done
  local schema='{"response_format":{"type":"json_schema","json_schema":{"name":"answer","schema":{"type":"object","properties":{"answer":{"type":"string"},"steps":{"type":"array","items":{"type":"string"}}},"required":["answer","steps"]}}}}'
  for body in '{}' '{"logprobs":true,"top_logprobs":5}' "$schema"; do
    LIMIT=80 run graphrt bench serve --model "$gguf" --device cuda --peer none --body "$body" --out "$OUT/json"
  done
}

moetune() {
  local models=${MODELS:-qwen3-30b-a3b,gpt-oss-20b,deepseek-v2-lite}
  LIMIT=150 TAIL=25 run python3 -m pytest -q -rf -m gpu -p no:cacheprovider tests/kernels/test_tuning.py \
    tests/engine/test_prefix_gpu.py tests/engine/test_mixed_extras.py tests/kv/test_latent_store.py \
    tests/models/test_mla_prologue_model.py tests/runtime/test_mla_runtime.py
  LIMIT=200 TAIL=40 run graphrt tune --models "$models" --iters 50
  cp -r /tmp/xdg/graphrt/tuning "$OUT/" 2>/dev/null
  GRAPHRT_FUSED_ROPE_STORE=0 LIMIT=70 run graphrt bench model --shape deepseek-v2-lite --batch-sizes 1 \
    --context 512 --iters 30 --no-compile --out "$OUT/json"
  for shape in ${SHAPES:-qwen3-30b-a3b gpt-oss-20b deepseek-v2-lite}; do
    for cache in 0 1; do
      GRAPHRT_CACHE=$cache LIMIT=70 run graphrt bench model --shape "$shape" --batch-sizes 1 --context 512 \
        --iters 30 --no-compile --out "$OUT/json"
    done
  done
}

suite() {
  LIMIT=${LIMIT_SUITE:-560} TAIL=40 run python3 -m pytest -q -rf -m gpu -p no:cacheprovider tests/kv/test_latent_store.py \
    tests/models/test_mla_prologue_model.py tests/runtime/test_mla_runtime.py tests
}

tuneall() {
  LIMIT=260 TAIL=40 run graphrt tune --models llama-3.2-1b,llama-3-8b,qwen3-30b-a3b,gpt-oss-20b,deepseek-v2-lite \
    --iters 50
  cp -r /tmp/xdg/graphrt/tuning "$OUT/" 2>/dev/null
  for shape in ${SHAPES:-llama-3.2-1b llama-3-8b qwen3-30b-a3b gpt-oss-20b deepseek-v2-lite}; do
    for cache in 0 1; do
      GRAPHRT_CACHE=$cache LIMIT=90 run graphrt bench model --shape "$shape" --batch-sizes "${BATCHES:-1,16,64}" \
        --context 512 --iters 30 --no-compile --out "$OUT/json"
    done
  done
}

tunedense() {
  # NOTE: two sweeps, each writing the table (the second starts from the first's): a sweep killed by
  # its time limit writes nothing
  local out="graphrt/kernels/tables/$(basename "$table")"
  LIMIT=230 TAIL=30 run graphrt tune --models llama-3.2-1b,llama-3-8b,qwen3-30b-a3b,gpt-oss-20b,deepseek-v2-lite \
    --only skinny,prologue,decode --iters 30 --out "$out"
  LIMIT=150 TAIL=20 run graphrt tune --models qwen3-30b-a3b,gpt-oss-20b,deepseek-v2-lite --only moe --iters 30 --out "$out"
  cp -r graphrt/kernels/tables "$OUT/" 2>/dev/null
}

newtests() {
  LIMIT=120 TAIL=15 run python3 -m pytest -q -rf -m gpu -p no:cacheprovider tests/engine/test_prefill_graph_extras.py \
    tests/engine/test_prefix_gpu.py tests/engine/test_mixed_extras.py
}

short() {
  # NOTE: what a short lease fits: the new GPU tests, then the dense presets' GEMM and decode sweeps
  newtests
  LIMIT=${LIMIT_TUNE:-200} TAIL=30 run graphrt tune --models llama-3.2-1b,llama-3-8b --only skinny,prologue,decode \
    --iters 20 --out "graphrt/kernels/tables/$(basename "$table")"
  cp -r graphrt/kernels/tables "$OUT/" 2>/dev/null
}

benchall() {
  for shape in ${SHAPES:-llama-3.2-1b llama-3-8b qwen3-30b-a3b deepseek-v2-lite gpt-oss-20b}; do
    LIMIT=80 run graphrt bench model --shape "$shape" --batch-sizes "${BATCHES:-1,16,64}" --context 512 --iters 30 \
      --no-compile --out "$OUT/json"
  done
}

kernels() {
  LIMIT=150 TAIL=25 run python3 -m pytest -q -rf -m gpu -p no:cacheprovider tests/kv/test_latent_store.py \
    tests/models/test_mla_prologue_model.py tests/runtime/test_mla_runtime.py tests/kernels/test_moe_experts.py
}

case "$what" in
moe) moe ;;
moetune) moetune ;;
suite) suite ;;
kernels) kernels ;;
tunedense) tunedense ;;
newtests) newtests ;;
benchall) benchall ;;
short) short ;;
tuneall) tuneall ;;
dense) dense ;;
spec) spec ;;
engine) engine ;;
*) echo "moe|dense|spec|engine|moetune|suite|tuneall|kernels|tunedense|newtests|benchall|short, got $what" >&2; exit 2 ;;
esac
tar -C "$OUT" -czf "$OUT/s9_${what}_json.tgz" json && rm -rf "$OUT/json"

#!/usr/bin/env bash
# GPU runs of 2026-12-07 (fifth session), after .gpu/install.sh and .gpu/install-model.sh:
#   bash bench/gpu_session11.sh smol|fused
# smol:  SmolLM2's overlapped engine at bs 1 (tokens/s, wall / GPU busy), then graphrt serve plain,
#        top-5 logprobs and a JSON schema (SERVE_CLIENTS), then n-gram / suffix speculation on the
#        copy and chat workloads at 4 drafted tokens against the overlapped plain loop.
# fused: the GPU tests of the fused RoPE + store decode, the MLA split decode and the split
#        sampler graph, then bench model bs 1 of their shapes, fused and not (FUSED_ENV=0), in one call.
set -uo pipefail
export PYTHONPATH=/tmp/sglk${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 XDG_CACHE_HOME=/tmp/xdg
what=${1:?smol|fused}
log="$OUT/s11_$what.log"
gguf=/tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
source bench/gpu_prelude.sh
mkdir -p "$OUT/json"
run() { echo "== $*" | tee -a "$log"; timeout "${LIMIT:-200}" "$@" 2>&1 | grep -vE "━|^\s*$" | tail -"${TAIL:-12}" | tee -a "$log"; }

smol() {
  LIMIT=120 run graphrt bench overlap --engine-model "$gguf" --batch-sizes 1 --context 64 --iters 200 --out "$OUT/json"
  local schema='{"response_format":{"type":"json_schema","json_schema":{"name":"answer","schema":{"type":"object","properties":{"answer":{"type":"string"},"steps":{"type":"array","items":{"type":"string"}}},"required":["answer","steps"]}}}}'
  for body in '{}' '{"logprobs":true,"top_logprobs":5}' "$schema"; do
    LIMIT=80 run graphrt bench serve --model "$gguf" --device cuda --peer none --concurrency "${SERVE_CLIENTS:-1,8}" \
      --body "$body" --out "$OUT/json"
  done
  for workload in copy chat; do
    LIMIT=100 run graphrt bench-spec --target "$gguf" --workload "$workload" --method ngram,suffix --topk 1 \
      --batch-sizes 1 --num-steps 4 --device cuda --max-new-tokens 256 --context 1024 --spec-overlap both \
      --out "$OUT/json"
  done
}

fused() {
  LIMIT=${LIMIT_TESTS:-200} TAIL=20 run python3 -m pytest -q -rf -m gpu -p no:cacheprovider ${TESTS:?TESTS}
  for shape in ${SHAPES:-llama-3.2-1b qwen3-30b-a3b deepseek-v2-lite gpt-oss-20b}; do
    for on in 1 0; do
      export "${FUSED_ENV:?FUSED_ENV}=$on"
      LIMIT=80 TAIL=8 run graphrt bench model --shape "$shape" --batch-sizes 1 \
        --context 512 --iters 30 --no-compile --out "$OUT/json/fused$on"
    done
  done
}

case "$what" in
smol) smol ;;
fused) fused ;;
*) echo "smol|fused, got $what" >&2; exit 2 ;;
esac
tar -C "$OUT" -czf "$OUT/s11_${what}_json.tgz" json && rm -rf "$OUT/json"

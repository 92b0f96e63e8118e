#!/usr/bin/env bash
# GPU runs of the eighth session (2026-12-07), after .gpu/install.sh and .gpu/install-model.sh:
#   bash bench/gpu_session14.sh lean|check|serve
# (the fused prologue over a few rows ran as `bash bench/gpu_session13.sh models`)
# lean: lean DECODE graphs (graphrt/runtime/lean.py) against .gpu/base (the tree before): the
#       idle gaps and device busy of LLM's bs-1 decode (bench/debug/decode_gaps.py), then serve
#       plain at SERVE_CLIENTS, and this tree's serve with top-5 logprobs (the full graph).
set -uo pipefail
export PYTHONPATH=/tmp/sglk${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 XDG_CACHE_HOME=/tmp/xdg
what=${1:?lean}
log="$OUT/s14_$what.log"
gguf=/tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
source bench/gpu_prelude.sh
mkdir -p "$OUT/json"
run() { echo "== $*" | tee -a "$log"; timeout "${LIMIT:-200}" "$@" 2>&1 | grep -vE "━|^\s*$" | tail -"${TAIL:-12}" | tee -a "$log"; }

lean() {
  LIMIT=150 TAIL=8 run python3 -m pytest -q -rf -p no:cacheprovider tests/runtime/test_lean.py tests/runtime/test_split_pairs.py
  for tree in new base; do
    local pp=$PYTHONPATH
    [ "$tree" = base ] && pp=$PWD/.gpu/base:$PYTHONPATH
    echo "#### tree $tree" | tee -a "$log"
    PYTHONPATH=$pp LIMIT=120 TAIL=70 run python3 bench/debug/decode_gaps.py "$gguf" 256
    PYTHONPATH=$pp LIMIT=90 run graphrt bench serve --model "$gguf" --device cuda --peer none \
      --concurrency "${SERVE_CLIENTS:-1,8,32}" --body '{}' --out "$OUT/json/$tree"
  done
  LIMIT=90 run graphrt bench serve --model "$gguf" --device cuda --peer none --concurrency "${SERVE_CLIENTS:-1,8,32}" \
    --body '{"logprobs":true,"top_logprobs":5}' --out "$OUT/json/logprobs"
}

# (ninth session) check: the GPU tests of lean graphs and the fused extras, the extras' bench, and
# decode_gaps for this tree (extras fused, then torch) and .gpu/base; serve: bench serve plain for
# this tree and .gpu/base, and this tree's logprobs / JSON schema with the extras fused and torch.
check() {
  LIMIT=200 TAIL=8 run python3 -m pytest -q -rf -p no:cacheprovider tests/runtime/test_lean.py \
    tests/runtime/test_split_pairs.py tests/runtime/test_sampler_extras.py tests/tools/test_bench_sampler.py
  LIMIT=120 TAIL=16 run graphrt bench sampler --batch-sizes 1,8,32 --vocabs 49152,128256 --iters 50 --out "$OUT/json"
  for tree in new torch base; do
    # NOTE: the base tree refuses an unknown GRAPHRT_* switch: it gets none
    local pp=$PYTHONPATH sw=GRAPHRT_FUSED_EXTRAS=1
    [ "$tree" = base ] && pp=$PWD/.gpu/base:$PYTHONPATH sw=
    [ "$tree" = torch ] && sw=GRAPHRT_FUSED_EXTRAS=0
    echo "#### decode_gaps $tree" | tee -a "$log"
    PYTHONPATH=$pp LIMIT=100 TAIL=40 run env $sw python3 bench/debug/decode_gaps.py "$gguf" 128
  done
}

serve() {
  local schema='{"response_format":{"type":"json_schema","json_schema":{"name":"answer","schema":{"type":"object","properties":{"answer":{"type":"string"},"steps":{"type":"array","items":{"type":"string"}}},"required":["answer","steps"]}}}}'
  local lp='{"logprobs":true,"top_logprobs":5}'
  local cases=("new 1 plain {}" "base 1 plain {}" "new 1 logprobs $lp" "new 1 schema $schema" "new 0 logprobs $lp" "new 0 schema $schema")
  for c in "${cases[@]}"; do
    read -r tree fused name body <<< "$c"
    local pp=$PYTHONPATH sw=GRAPHRT_FUSED_EXTRAS=$fused
    [ "$tree" = base ] && pp=$PWD/.gpu/base:$PYTHONPATH sw=
    echo "#### serve $tree extras=$fused $name" | tee -a "$log"
    PYTHONPATH=$pp LIMIT=100 run env $sw graphrt bench serve --model "$gguf" --device cuda \
      --peer none --concurrency "${SERVE_CLIENTS:-1,8,32}" --body "$body" --out "$OUT/json/$tree-$fused-$name"
  done
}

case "$what" in
lean) lean ;;
check) check ;;
serve) serve ;;
*) echo "lean|check|serve, got $what" >&2; exit 2 ;;
esac
tar -C "$OUT" -czf "$OUT/s14_${what}_json.tgz" json && rm -rf "$OUT/json"

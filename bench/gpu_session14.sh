#!/usr/bin/env bash
# GPU runs of the eighth session (2026-12-07), after .gpu/install.sh and .gpu/install-model.sh:
#   bash bench/gpu_session14.sh lean|check|serve|bodies
# (the fused prologue over a few rows ran as `bash bench/gpu_session13.sh models`)
# lean: lean DECODE graphs (graphrt/runtime/lean.py) against .gpu/base (the tree before): the
#       idle gaps and device busy of LLM's bs-1 decode (bench/debug/decode_gaps.py), then serve
#       plain at SERVE_CLIENTS, and this tree's serve with top-5 logprobs (the full graph).
set -uo pipefail
export PYTHONPATH=/tmp/sglk${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 XDG_CACHE_HOME=/tmp/xdg
what=${1:?lean|check|serve|bodies}
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
# The base tree is installed into /tmp/base_site and run from /tmp (an editable install maps
# graphrt.capture and the rest to this tree's folders whatever PYTHONPATH says); it gets no
# switch it does not know (it refuses an unknown GRAPHRT_* switch). NOTE: measured with the extras'
# own switch GRAPHRT_FUSED_EXTRAS; it is GRAPHRT_FUSED_SAMPLER now, which turns the draw to torch too.
base_site() {
  [ -d /tmp/base_site ] && return
  python3 -m pip install -q --no-deps --no-build-isolation --target /tmp/base_site .gpu/base >/dev/null 2>&1 \
    || echo "base tree install failed" | tee -a "$log"
  sed 's/import Op, device_ops, family, kernel_breakdown/import Op, device_ops, kernel_breakdown, _family as family/' \
    bench/debug/decode_gaps.py > /tmp/decode_gaps_base.py
}

# $1: new (extras fused), torch (extras in torch) or base; then the command
in_tree() {
  local tree=$1
  shift
  case "$tree" in
  base) (cd /tmp && PYTHONPATH=/tmp/base_site:$PYTHONPATH run "$@") ;;
  torch) run env GRAPHRT_FUSED_SAMPLER=0 "$@" ;;
  *) run env GRAPHRT_FUSED_SAMPLER=1 "$@" ;;
  esac
}

check() {
  base_site
  LIMIT=200 TAIL=8 run python3 -m pytest -q -rf -p no:cacheprovider tests/runtime/test_lean.py \
    tests/runtime/test_split_pairs.py tests/runtime/test_sampler_extras.py tests/tools/test_bench_sampler.py
  LIMIT=120 TAIL=16 run graphrt bench sampler --batch-sizes 1,8,32 --vocabs 49152,128256 --iters 50 --out "$OUT/json"
  for tree in new torch base; do
    local script=$PWD/bench/debug/decode_gaps.py
    [ "$tree" = base ] && script=/tmp/decode_gaps_base.py
    echo "#### decode_gaps $tree" | tee -a "$log"
    LIMIT=100 TAIL=90 in_tree "$tree" python3 "$script" "$gguf" 128
  done
}

schema='{"response_format":{"type":"json_schema","json_schema":{"name":"answer","schema":{"type":"object","properties":{"answer":{"type":"string"},"steps":{"type":"array","items":{"type":"string"}}},"required":["answer","steps"]}}}}'
lp='{"logprobs":true,"top_logprobs":5}'

# $@: "tree name body" cases, one bench serve run each
serve_cases() {
  for c in "$@"; do
    read -r tree name body <<< "$c"
    echo "#### serve $tree $name" | tee -a "$log"
    LIMIT=100 in_tree "$tree" python3 -m graphrt bench serve --model "$gguf" --device cuda --peer none \
      --concurrency "${SERVE_CLIENTS:-1,8,32}" --body "$body" --out "$OUT/json/$tree-$name"
  done
}

serve() {
  base_site
  serve_cases "new plain {}" "base plain {}" "new logprobs $lp" "new schema $schema" "torch logprobs $lp" \
    "torch schema $schema"
}

# (tenth session) bodies: bench serve --bodies logprobs,schema --repeats 3 (#39's ratios on one
# server), then plain / logprobs / schema of this tree and .gpu/base (7a9b135: a wake-up of the
# asyncio loop per token, no coalescing of a stream's queued updates), the trees alternating.
bodies() {
  base_site
  echo "#### serve new: logprobs and schema against plain, one server, 3 rounds" | tee -a "$log"
  LIMIT=500 TAIL=16 run python3 -m graphrt bench serve --model "$gguf" --device cuda --peer none \
    --concurrency "${SERVE_CLIENTS:-1,8,32}" --bodies logprobs,schema --repeats 3 --out "$OUT/json/new-bodies"
  serve_cases "new plain {}" "base plain {}" "new logprobs $lp" "base logprobs $lp" "new schema $schema" \
    "base schema $schema"
}

case "$what" in
lean) lean ;;
check) check ;;
serve) serve ;;
bodies) bodies ;;
*) echo "lean|check|serve|bodies, got $what" >&2; exit 2 ;;
esac
tar -C "$OUT" -czf "$OUT/s14_${what}_json.tgz" json && rm -rf "$OUT/json"

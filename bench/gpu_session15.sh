#!/usr/bin/env bash
# GPU runs of 2026-12-08 (tenth session), after .gpu/install.sh and .gpu/install-model.sh:
#   bash bench/gpu_session15.sh serve
# serve: `graphrt bench serve --bodies logprobs,schema --repeats 3` (#39's ratios on one server),
#        then bench serve of this tree and .gpu/base (7a9b135: a wake-up of the asyncio loop per
#        token, no coalescing), plain / top-5 logprobs / JSON schema, the two trees alternating.
# The base tree runs from /tmp/base_site (bench/gpu_session14.sh says why).
set -uo pipefail
export PYTHONPATH=/tmp/sglk${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 XDG_CACHE_HOME=/tmp/xdg
what=${1:?serve}
log="$OUT/s15_$what.log"
gguf=/tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
source bench/gpu_prelude.sh
mkdir -p "$OUT/json"
run() { echo "== $*" | tee -a "$log"; timeout "${LIMIT:-200}" "$@" 2>&1 | grep -vE "━|^\s*$" | tail -"${TAIL:-12}" | tee -a "$log"; }

base_site() {
  [ -d /tmp/base_site ] && return
  python3 -m pip install -q --no-deps --no-build-isolation --target /tmp/base_site .gpu/base >/dev/null 2>&1 \
    || echo "base tree install failed" | tee -a "$log"
}

in_tree() {
  local tree=$1
  shift
  case "$tree" in
  base) (cd /tmp && PYTHONPATH=/tmp/base_site:$PYTHONPATH run "$@") ;;
  *) run "$@" ;;
  esac
}

serve() {
  base_site
  echo "#### serve new: logprobs and schema against plain, one server, 3 rounds" | tee -a "$log"
  LIMIT=500 TAIL=16 run python3 -m graphrt bench serve --model "$gguf" --device cuda --peer none \
    --concurrency "${SERVE_CLIENTS:-1,8,32}" --bodies logprobs,schema --repeats 3 --out "$OUT/json/new-bodies"
  local schema='{"response_format":{"type":"json_schema","json_schema":{"name":"answer","schema":{"type":"object","properties":{"answer":{"type":"string"},"steps":{"type":"array","items":{"type":"string"}}},"required":["answer","steps"]}}}}'
  local lp='{"logprobs":true,"top_logprobs":5}'
  local cases=("new plain {}" "base plain {}" "new logprobs $lp" "base logprobs $lp" "new schema $schema"
    "base schema $schema")
  for c in "${cases[@]}"; do
    read -r tree name body <<< "$c"
    echo "#### serve $tree $name" | tee -a "$log"
    LIMIT=100 in_tree "$tree" python3 -m graphrt bench serve --model "$gguf" --device cuda --peer none \
      --concurrency "${SERVE_CLIENTS:-1,8,32}" --body "$body" --out "$OUT/json/$tree-$name"
  done
}

case "$what" in
serve) serve ;;
*) echo "serve, got $what" >&2; exit 2 ;;
esac
tar -C "$OUT" -czf "$OUT/s15_${what}_json.tgz" json && rm -rf "$OUT/json"

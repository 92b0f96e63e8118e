#!/usr/bin/env bash
# GPU runs of 2026-12-07 (seventh session), after .gpu/install.sh and .gpu/install-model.sh:
#   bash bench/gpu_session13.sh diag|ab
# diag: per-kernel device µs of SmolLM2's bs-1 DECODE and TARGET_VERIFY graphs, each profiled
#       inside a step of its own mode (bench/debug/verify_kernels.py), then serve plain and JSON
#       schema at SERVE_CLIENTS.
# ab:   the split decode kernel's verify chains: its GPU tests and the speculative engines' GPU
#       tests, then for this tree and .gpu/base (the tree before, carried) the kernel profile
#       and bench-spec chat / copy at SPEC_STEPS drafted tokens (n-gram, suffix; median of 3).
set -uo pipefail
export PYTHONPATH=/tmp/sglk${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 XDG_CACHE_HOME=/tmp/xdg
what=${1:?diag}
log="$OUT/s13_$what.log"
gguf=/tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
source bench/gpu_prelude.sh
mkdir -p "$OUT/json"
run() { echo "== $*" | tee -a "$log"; timeout "${LIMIT:-200}" "$@" 2>&1 | grep -vE "━|^\s*$" | tail -"${TAIL:-12}" | tee -a "$log"; }

diag() {
  LIMIT=150 TAIL=80 run python3 bench/debug/verify_kernels.py "$gguf" "${STEPS:-4}" 20
  local schema='{"response_format":{"type":"json_schema","json_schema":{"name":"answer","schema":{"type":"object","properties":{"answer":{"type":"string"},"steps":{"type":"array","items":{"type":"string"}}},"required":["answer","steps"]}}}}'
  for body in '{}' "$schema"; do
    LIMIT=70 run graphrt bench serve --model "$gguf" --device cuda --peer none --concurrency "${SERVE_CLIENTS:-1,8,32}" \
      --body "$body" --out "$OUT/json"
  done
}

ab() {
  LIMIT=240 TAIL=15 run python3 -m pytest -q -rf -m gpu -p no:cacheprovider tests/attention/test_decode_attend.py \
    tests/attention/test_decode_rope.py tests/attention/test_decode_kernel.py tests/engine/test_spec_lookup_gpu.py \
    tests/engine/test_overlap.py
  for tree in new base; do
    local pp=$PYTHONPATH
    [ "$tree" = base ] && pp=$PWD/.gpu/base:$PYTHONPATH
    echo "#### tree $tree" | tee -a "$log"
    PYTHONPATH=$pp LIMIT=150 TAIL=45 run python3 bench/debug/verify_kernels.py "$gguf" "${STEPS:-4}" 20
    for steps in ${SPEC_STEPS:-4}; do
      for workload in chat copy; do
        PYTHONPATH=$pp LIMIT=80 run graphrt bench-spec --target "$gguf" --workload "$workload" --method ngram,suffix \
          --topk 1 --batch-sizes 1 --num-steps "$steps" --device cuda --max-new-tokens 256 --context 1024 \
          --repeats 3 --out "$OUT/json/$tree"
      done
    done
  done
}

case "$what" in
diag) diag ;;
ab) ab ;;
*) echo "diag|ab, got $what" >&2; exit 2 ;;
esac
tar -C "$OUT" -czf "$OUT/s13_${what}_json.tgz" json && rm -rf "$OUT/json"

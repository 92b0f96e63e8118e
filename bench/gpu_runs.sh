#!/usr/bin/env bash
# On the H100, after gpu_suite.sh: the demo on SmolLM2 (GGUF staged in /tmp/models) with a
# snapshot, inspect, generate, and the host-cost and decode benches. Logs and JSON in $OUT.
set -uo pipefail
export PYTHONPATH=/tmp/sglk PYTHONUNBUFFERED=1
log="$OUT/runs.log"
gguf=/tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
timeout 150 graphrt demo --model "$gguf" --snapshot "$OUT/snap.json" 2>&1 | tee "$log"
timeout 60 graphrt inspect "$OUT/snap.json" --width 160 > "$OUT/inspect.txt" 2>&1
timeout 90 graphrt generate --model "$gguf" --prompt "What is the capital of France?" --max-new-tokens 24 2>&1 | tee -a "$log"
timeout 200 graphrt bench host --modes decode,verify-chain,verify-tree,draft-decode,draft-extend --page-sizes 16 \
  --context-lens 4096 --iters 300 --out "$OUT" 2>&1 | tail -40 | tee -a "$log"
timeout 120 graphrt bench host --modes decode --page-sizes 1,16 --context-lens 4096,131072 --iters 300 --out "$OUT" \
  2>&1 | tail -25 | tee -a "$log"

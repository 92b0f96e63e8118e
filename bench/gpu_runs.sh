#!/usr/bin/env bash
# On the H100, after gpu_suite.sh: the demo on SmolLM2 (GGUF staged in /tmp/models) with a
# snapshot, inspect, generate, and the host-cost and decode benches. Logs and JSON in $OUT.
set -uo pipefail
export PYTHONPATH=/tmp/sglk PYTHONUNBUFFERED=1
log="$OUT/runs.log"
gguf=/tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
for whl in .gpu/cxxfilt-*.whl; do [ -f "$whl" ] && python3 -m pip install -q --no-deps "$whl"; done
timeout 150 graphrt demo --model "$gguf" --snapshot "$OUT/snap.json" 2>&1 | tee "$log"
timeout 60 graphrt inspect "$OUT/snap.json" --width 160 > "$OUT/inspect.txt" 2>&1
timeout 90 graphrt generate --model "$gguf" --prompt "What is the capital of France?" --max-new-tokens 24 2>&1 | tee -a "$log"
timeout 150 graphrt bench --batch-sizes 1,8,64 --iters 100 --out "$OUT" 2>&1 | tail -20 | tee -a "$log"
timeout 120 python3 bench/gpu_smollm2_vs_hf.py "$gguf" 2>&1 | grep -v cxxfilt | tail -4 | tee -a "$log"

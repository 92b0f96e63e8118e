#!/usr/bin/env bash
# Lazy capture on the GPU machine (after .gpu/install.sh and .gpu/install-model.sh):
#   bash bench/gpu_first_answer.sh
# 1. the lazy-capture tests (CPU and GPU-marked) and the engine's graph-vs-eager tests;
# 2. `graphrt bench first-answer`: cold processes' LLM(SmolLM2) to the first answer, lazy vs
#    eager capture, 3 runs each after one untimed warm-up run (JSON in $OUT);
# 3. `graphrt generate` phase lines, lazy and eager, one cold process each.
set -uo pipefail
export PYTHONPATH=/tmp/sglk${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
gguf=/tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
log="$OUT/first_answer.log"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || { echo "pip install failed"; exit 1; }
for whl in .gpu/*.whl .gpu/wheels/*.whl; do [ -f "$whl" ] && python3 -m pip install -q --no-deps "$whl" >/dev/null 2>&1; done
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$log"
echo "== tests" | tee -a "$log"
python3 -m pytest -q -p no:cacheprovider tests/runtime/test_lazy_capture.py tests/engine/test_lazy_engine.py \
  tests/tools/test_inspect_lazy.py tests/test_import_cost.py tests/engine/test_engine.py 2>&1 | tail -15 | tee -a "$log"
echo "== bench first-answer" | tee -a "$log"
graphrt bench first-answer --model "$gguf" --runs 3 --out "$OUT" 2>&1 | tail -20 | tee -a "$log"
for capture in lazy eager; do
  echo "== generate --capture $capture (cold process)" | tee -a "$log"
  graphrt generate --model "$gguf" --capture "$capture" --prompt "What is the capital of France?" \
    --max-new-tokens 16 --max-batch-size 32 --log-level info 2>&1 | tail -4 | tee -a "$log"
done

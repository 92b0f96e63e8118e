#!/usr/bin/env bash
# From text to text on the GPU machine (after .gpu/install.sh and .gpu/install-model.sh):
#   bash bench/gpu_text.sh
# 1. `graphrt generate` phase timings, cold process: without the conversion cache, then a first
#    run (converts the GGUF into an emptied cache) and two more (cache hits);
# 2. `graphrt serve` time to ready (polls /health);
# 3. `graphrt bench serve` against `transformers serve` at concurrency 1, 8 and 32.
# Logs and JSON go to $OUT.
set -uo pipefail
export PYTHONPATH=/tmp/sglk${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
gguf=/tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
log="$OUT/text.log"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || { echo "pip install failed"; exit 1; }
for whl in .gpu/*.whl .gpu/wheels/*.whl; do [ -f "$whl" ] && python3 -m pip install -q --no-deps "$whl" >/dev/null 2>&1; done
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$log"
XDG_CACHE_HOME=$(mktemp -d) && export XDG_CACHE_HOME  # NOTE: an empty cache: the first run converts
for run in "cache off" first second third; do
  echo "== generate ($run, cold process)" | tee -a "$log"
  cache=1; [ "$run" = "cache off" ] && cache=0
  TIMEFORMAT="wall %R s"; { time GRAPHRT_CACHE=$cache graphrt generate --model "$gguf" \
    --prompt "What is the capital of France?" --max-new-tokens 10 --log-level info 2>&1 | tail -6; } 2>&1 | tee -a "$log"
done
echo "== serve: time to ready" | tee -a "$log"
start=$(date +%s%N)
graphrt serve --model "$gguf" --port 8123 > "$OUT/serve_stderr.log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do
  curl -sf http://127.0.0.1:8123/health >/dev/null 2>&1 && break
  sleep 0.1
done
echo "ready after $(( ($(date +%s%N) - start) / 1000000 )) ms (health answered)" | tee -a "$log"
curl -s http://127.0.0.1:8123/v1/chat/completions -H 'Content-Type: application/json' \
  -d '{"model":"x","messages":[{"role":"user","content":"What is the capital of France?"}],"max_tokens":12,"temperature":0}' \
  | tee -a "$log"; echo | tee -a "$log"
kill -INT $pid; wait $pid
tail -3 "$OUT/serve_stderr.log" | tee -a "$log"
echo "== bench serve" | tee -a "$log"
# NOTE: the servers' logs go to a temp dir: under $OUT they come back with the results.
mkdir -p "$OUT/tmp"
TMPDIR="$OUT/tmp" timeout "${SERVE_LIMIT:-330}" graphrt bench serve --model "$gguf" --concurrency 1,8,32 ${SERVE_ARGS:-} --out "$OUT" 2>&1 | tail -30 | tee -a "$log"

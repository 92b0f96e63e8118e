#!/usr/bin/env bash
# `graphrt serve --tp 2` on two GPUs (NCCL, multicast off): a tiny random Llama checkpoint with a
# word tokenizer (4 heads / 2 KV heads), greedy completions before and after an idle spell of
# more than two group timeouts, /health, then Ctrl-C: `bash bench/gpu_serve_tp.sh` (needs the
# serve wheels; FA3 is not needed: the backend is whatever the machine offers).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
log="$OUT/serve_tp.log"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || { echo "pip install failed"; exit 1; }
for whl in .gpu/wheels/*.whl; do [ -f "$whl" ] && python3 -m pip install -q --no-deps "$whl" >/dev/null 2>&1; done
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$log"
python3 -c "from pathlib import Path; from tests.parallel.test_tp_load import make_checkpoint; from tests.support.hf_util import save_word_tokenizer; p=make_checkpoint(Path('/tmp/tiny-tp'),'Llama',dict(num_attention_heads=4,num_key_value_heads=2)); save_word_tokenizer(p,96)" 2>&1 | tail -2
ask() { curl -s localhost:8000/v1/completions -H 'Content-Type: application/json' \
  -d '{"model":"m","prompt":"t1 t2 t3","max_tokens":8,"temperature":0}'; echo; }
GRAPHRT_TP_TIMEOUT=10 torchrun --nproc-per-node 2 -m graphrt serve --model /tmp/tiny-tp --tp 2 --device cuda \
  --port 8000 --max-batch-size 8 --max-context-len 128 > "$OUT/serve_tp_stdout.log" 2> "$OUT/serve_tp.err" &
pid=$!
for _ in $(seq 1 120); do grep -q "ready in" "$OUT/serve_tp.err" && break; sleep 1; done
grep "ready in" "$OUT/serve_tp.err" | tee -a "$log"
first=$(ask); echo "first:  $first" | tee -a "$log"
sleep 25  # NOTE: idle for 2.5 group timeouts: the followers must not time out
second=$(ask); echo "second: $second" | tee -a "$log"
curl -s localhost:8000/health | tee -a "$log"; echo | tee -a "$log"
[ "$(echo "$first" | python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"])')" = \
  "$(echo "$second" | python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"])')" ] \
  && echo "same greedy text before and after the idle spell" | tee -a "$log"
kill -INT $pid; wait $pid; echo "torchrun rc=$?" | tee -a "$log"
grep -E "graphrt serve: stopped|lost rank|Traceback|Error" "$OUT/serve_tp.err" | head -8 | tee -a "$log"

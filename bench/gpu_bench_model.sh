#!/usr/bin/env bash
# On the GPU machine (sgl-kernel already installed by .gpu/install.sh): `graphrt bench model` at the
# llama-3-8b shape (random bf16 weights), bs 1/16/64, 512 real tokens per row: graphrt's graphed
# DECODE (FA3) against the weight-read floor and transformers (eager, and torch.compile
# reduce-overhead). JSON and bench_model.log go to $OUT.
#
# Fits 9 minutes: the whole run is cut at BENCH_LIMIT (500 s); torch.compile gets COMPILE_BUDGET
# (300 s): a batch size whose compile would overrun it (estimated from the previous one) is
# skipped and says so in the JSON and the table (at 8B expect bs 1 and 16 compiled, bs 64 maybe).
set -uo pipefail
export PYTHONPATH=/tmp/sglk PYTHONUNBUFFERED=1
log="$OUT/bench_model.log"
python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$log"
python3 -c "import torch, transformers, sgl_kernel; print('torch', torch.__version__, 'transformers', transformers.__version__, 'sgl_kernel', sgl_kernel.__version__)" 2>&1 | tee -a "$log"
timeout "${BENCH_LIMIT:-500}" graphrt bench model --shape llama-3-8b --batch-sizes "${BATCH_SIZES:-1,16,64}" \
  --context 512 --iters 30 --compile-budget "${COMPILE_BUDGET:-300}" --out "$OUT" 2>&1 | tee -a "$log"
echo "exit ${PIPESTATUS[0]}" | tee -a "$log"

#!/usr/bin/env bash
# On the GPU machine (sgl-kernel already installed by .gpu/install.sh): decode and speculative-step
# benchmarks, FA3 vs eager, and the FlashMLA per-layer bench. JSON and bench.log go to $OUT.
set -uo pipefail
export PYTHONPATH=/tmp/sglk PYTHONUNBUFFERED=1
log="$OUT/bench.log"
python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
graphrt bench --batch-sizes 1,8,64 --out "$OUT" 2>&1 | tee "$log"
graphrt bench-spec --batch-sizes 1,8,32 --out "$OUT" 2>&1 | tee -a "$log"

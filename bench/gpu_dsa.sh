#!/usr/bin/env bash
# On the GPU machine, after .gpu/install.sh (base part: FlashMLA): DSA tests + FlashMLA bench.
# Logs and JSON go to $OUT.
set -uo pipefail
export PYTHONPATH=/tmp/sglk PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/env.log"
python3 -m pytest -q -rs tests/attention/test_mla_sparse.py tests/kv/test_mla_cache.py tests/runtime/test_dsa_runtime.py tests/engine/test_dsa_engine.py 2>&1 | tee "$OUT/pytest_dsa.log"
python3 -m graphrt.tools.bench.mla --out "$OUT" --q-len 1 2>&1 | tee "$OUT/bench_mla.log"
python3 -m graphrt.tools.bench.mla --out "$OUT" --q-len 2 2>&1 | tee -a "$OUT/bench_mla.log"

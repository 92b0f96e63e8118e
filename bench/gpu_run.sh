#!/usr/bin/env bash
# On the GPU machine, after .gpu/install.sh: install, full test suite (CPU + CUDA), the demo with a
# snapshot, and `graphrt inspect` of it. Everything lands in $OUT (run.log, snap.json + .npz).
set -uo pipefail
export PYTHONPATH=/tmp/sglk PYTHONUNBUFFERED=1
log="$OUT/run.log"
python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$log"
python3 -c "import torch, sgl_kernel; print('torch', torch.__version__, 'sgl_kernel', sgl_kernel.__version__)" | tee -a "$log"
timeout "${PYTEST_LIMIT:-420}" python3 -m pytest -q -rs -p no:cacheprovider 2>&1 | tail -60 | tee -a "$log"
graphrt demo --snapshot "$OUT/snap.json" 2>&1 | tee -a "$log"
graphrt inspect "$OUT/snap.json" --width 150 2>&1 | tee -a "$log"

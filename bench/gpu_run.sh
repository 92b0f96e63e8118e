#!/usr/bin/env bash
# On the GPU machine, after .gpu/install.sh: install, full test suite (CPU + CUDA), demo, bench.
# Logs and JSON go to $OUT.
set -uo pipefail
export PYTHONPATH=/tmp/sglk PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/env.log"
python3 -c "import torch, sgl_kernel; print('torch', torch.__version__, 'sgl_kernel', sgl_kernel.__version__)" | tee -a "$OUT/env.log"
python3 -m pytest -q -rs 2>&1 | tee "$OUT/pytest.log"
graphrt demo 2>&1 | tee "$OUT/demo.log"
graphrt bench --batch-sizes 1,8,64 --out "$OUT" 2>&1 | tee "$OUT/bench.log"
graphrt bench --batch-sizes 1,8,64 --backend reference --out "$OUT" 2>&1 | tee -a "$OUT/bench.log"

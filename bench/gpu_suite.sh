#!/usr/bin/env bash
# On the H100 (after .gpu/install.sh and .gpu/install-model.sh): install graphrt, run the whole
# suite (CPU + CUDA) and log it to $OUT/suite.log.
set -uo pipefail
export PYTHONPATH=/tmp/sglk PYTHONUNBUFFERED=1
log="$OUT/suite.log"
python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
# NOTE: the GPU machine has no index: cxxfilt (a base dependency) comes as a carried wheel.
for whl in .gpu/cxxfilt-*.whl; do [ -f "$whl" ] && python3 -m pip install -q --no-deps "$whl"; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$log"
python3 -c "import torch, sgl_kernel, triton, transformers; print('torch', torch.__version__, 'sgl_kernel', sgl_kernel.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee -a "$log"
timeout "${PYTEST_LIMIT:-500}" python3 -m pytest -q -rfs -p no:cacheprovider "$@" > "$OUT/suite_full.log" 2>&1
tail -80 "$OUT/suite_full.log" | tee -a "$log"

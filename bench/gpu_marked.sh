#!/usr/bin/env bash
# Every GPU-marked test (`-m gpu`), in two halves that each fit one device call:
#   bash bench/gpu_marked.sh A|B [pytest args]   (after .gpu/install.sh; B's SmolLM2 tests need /tmp/models)
# Logs: $OUT/marked_<part>.log (summary) and $OUT/marked_<part>_full.log.
set -uo pipefail
export PYTHONPATH=/tmp/sglk${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
part=${1:?A or B}
shift
case "$part" in
A) dirs="tests/attention tests/buffers tests/capture tests/kv tests/metadata tests/step tests/debug" ;;
B) dirs="tests/engine tests/models tests/parallel tests/runtime tests/serve tests/text tests/tools tests/test_llm.py" ;;
*) echo "part must be A or B, got $part" >&2; exit 2 ;;
esac
log="$OUT/marked_$part.log"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || { echo "pip install failed"; exit 1; }
for whl in .gpu/*.whl .gpu/wheels/*.whl; do [ -f "$whl" ] && python3 -m pip install -q --no-deps "$whl" >/dev/null 2>&1; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$log"
python3 -c "import torch, triton, sgl_kernel, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'sgl_kernel', sgl_kernel.__version__, 'transformers', transformers.__version__)" 2>&1 | tee -a "$log"
timeout "${PYTEST_LIMIT:-420}" python3 -m pytest -q -rf -m gpu -p no:cacheprovider $dirs "$@" > "$OUT/marked_${part}_full.log" 2>&1
echo "pytest rc=$?" | tee -a "$log"
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/marked_${part}_full.log" | tail -40 | tee -a "$log"

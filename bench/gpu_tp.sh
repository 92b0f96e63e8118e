#!/usr/bin/env bash
# Tensor parallelism on 2 GPUs of one host (nvidia-h200-x2): gpu-marked TP tests, the all-reduce
# bench (NCCL vs torch's one-shot vs our p2p kernel in a graph), the TP=1 vs TP=2 decode bench (Llama-3-8B shape, random
# bf16), and the torchrun demo. NVLink multicast stays off. Everything lands in $OUT.
#   bash bench/gpu_tp.sh [tests|bench|all|p2p|default]   (tests: TP tests + all-reduce bench; bench: the rest;
#   p2p: the p2p tests and the decode step at TP=1 and TP=2 with NCCL and with the p2p kernel;
#   default: the p2p GPU tests (2 GPUs, and its timeout on one), then the step at TP=1 and at TP=2 with the default mode)
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
export PYTHONPATH=${PYTHONPATH:-/tmp/sglk}
OUT=${OUT:-bench/results/gpu_tp}
mkdir -p "$OUT"
part=${1:-all}
log="$OUT/tp_$part.log"
python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$log"
nvidia-smi topo -m 2>&1 | tee -a "$log"
python3 -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version(), 'gpus', torch.cuda.device_count())" | tee -a "$log"
status=0
step() { echo "== $*" | tee -a "$log"; timeout "${STEP_LIMIT:-480}" "$@" 2>&1 | tee -a "$log"; s=${PIPESTATUS[0]}; echo "== exit $s" | tee -a "$log"; [ "$s" = 0 ] || status=1; }
if [ "$part" = default ]; then
  step python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/parallel/test_p2p_gpu.py tests/parallel/test_p2p_kernel.py
  step python3 -m graphrt.tools.bench.tp --tp 1 --out "$OUT"
  step torchrun --nproc-per-node 2 -m graphrt.tools.bench.tp --tp 2 --out "$OUT"
  echo "status $status" | tee -a "$log"
  exit $status
fi
if [ "$part" = p2p ]; then
  step python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/parallel/test_p2p_gpu.py
  step python3 -m graphrt.tools.bench.tp --tp 1 --out "$OUT"
  for mode in nccl p2p; do GRAPHRT_ALLREDUCE=$mode step torchrun --nproc-per-node 2 -m graphrt.tools.bench.tp --tp 2 --out "$OUT"; done
  echo "status $status" | tee -a "$log"
  exit $status
fi
if [ "$part" != bench ]; then
step python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/parallel/test_tp_gpu.py tests/parallel/test_tp_checkpoints.py tests/parallel/test_p2p_gpu.py
step python3 -m pytest -q -rs -p no:cacheprovider tests/parallel/test_shm_ring.py
step torchrun --nproc-per-node 2 -m graphrt.tools.bench.allreduce --out "$OUT"
fi
[ "$part" = tests ] && { echo "status $status" | tee -a "$log"; exit $status; }
step python3 -m graphrt.tools.bench.tp --tp 1 --out "$OUT"
GRAPHRT_ALLREDUCE=nccl step torchrun --nproc-per-node 2 -m graphrt.tools.bench.tp --tp 2 --out "$OUT"
GRAPHRT_ALLREDUCE=oneshot step torchrun --nproc-per-node 2 -m graphrt.tools.bench.tp --tp 2 --out "$OUT"
GRAPHRT_ALLREDUCE=p2p step torchrun --nproc-per-node 2 -m graphrt.tools.bench.tp --tp 2 --out "$OUT"
step torchrun --nproc-per-node 2 -m graphrt demo --tp 2 --prompts 8 --max-new-tokens 16
cp "$OUT"/*.json bench/results/ 2>/dev/null || true
echo "status $status" | tee -a "$log"
exit $status

#!/usr/bin/env bash
# One H100 call (after .gpu/install.sh and .gpu/install-model.sh) for what issues 10 and 11 still
# need on the GPU, in under ~9 minutes; logs and JSON in $OUT:
#   the model bench (with its kernel breakdown), the GPU tests part B did not reach
#   (tp_checkpoints, overlap), speculative decoding on SmolLM2 drafting for itself (fp32 on the reference backend: tokens must equal plain greedy; bf16 on
#   FA3), SmolLM2 vs transformers, and the overlap bench.
set -uo pipefail
export PYTHONPATH=/tmp/sglk PYTHONUNBUFFERED=1
gguf=/tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
for whl in .gpu/cxxfilt-*.whl; do [ -f "$whl" ] && python3 -m pip install -q --no-deps "$whl"; done
step() {  # step NAME SECONDS CMD...: run CMD under a time limit, log to $OUT/NAME.log, say how it ended
  local name=$1 limit=$2
  shift 2
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "$name: exit $? ($(grep -a -c . "$OUT/$name.log") lines)"
}
step model 200 graphrt bench model --no-compile --batch-sizes 1,16,64 --iters 20 --out "$OUT"
grep -a "│" "$OUT/model.log" | tail -4; grep -a "device:" "$OUT/model.log"
step tests 120 python3 -m pytest -q -rfs -p no:cacheprovider tests/parallel/test_tp_checkpoints.py tests/engine/test_overlap.py -k "not cpu"
tail -3 "$OUT/tests.log"
for dtype in fp32 bf16; do
  step "spec_$dtype" 110 graphrt bench-spec --target "$gguf" --device cuda --batch-sizes 8 --topk 1,2,4 \
    --num-steps 3 --max-new-tokens 64 --context 512 --dtype "$dtype" --out "$OUT"
  grep -a "│" "$OUT/spec_$dtype.log" | tail -4
done
step vs_hf 180 python3 bench/gpu_smollm2_vs_hf.py "$gguf"
grep -av "Converting\|Loading" "$OUT/vs_hf.log" | tail -6
step overlap 90 graphrt bench overlap --batch-sizes 1,16,64 --iters 200 --context 128 --out "$OUT"
grep -a "│" "$OUT/overlap.log" | tail -4

#!/usr/bin/env bash
# One H200 call (after .gpu/install.sh and .gpu/install-model.sh) for issue 42, logs and JSON in
# $OUT: the GPU-marked speculative tests, then bench-spec against the plain loop (overlap on) at
# the same batch size: SmolLM2 on the copy-heavy and chat prompt sets (bs 1), with back-off at
# bs 32 and 64, and the pipeline's ceiling (llama-3-8b shape, random weights, always-match).
set -uo pipefail
export PYTHONPATH=/tmp/sglk PYTHONUNBUFFERED=1
gguf=/tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
step() {  # step NAME SECONDS CMD...: run CMD under a time limit, log to $OUT/NAME.log, say how it ended
  local name=$1 limit=$2
  shift 2
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "$name: exit $? ($(grep -a -c . "$OUT/$name.log") lines)"
}
step tests 150 python3 -m pytest -q -rfs -p no:cacheprovider -m gpu tests/engine/test_spec_lookup_gpu.py
tail -3 "$OUT/tests.log"
common=(--device cuda --num-steps 4 --max-new-tokens 256 --context 1024 --out "$OUT")
for workload in copy chat; do
  step "smollm2_$workload" 150 graphrt bench-spec --target "$gguf" --workload "$workload" \
    --method ngram,suffix --topk 1 --batch-sizes 1 "${common[@]}"
  grep -a "│" "$OUT/smollm2_$workload.log" | tail -3
done
step smollm2_suffix_tree 120 graphrt bench-spec --target "$gguf" --workload copy --method suffix \
  --topk 2,4 --batch-sizes 1 "${common[@]}"
grep -a "│" "$OUT/smollm2_suffix_tree.log" | tail -3
step smollm2_batch 200 graphrt bench-spec --target "$gguf" --workload chat --method ngram \
  --batch-sizes 32,64 --disable-batch-size 16 "${common[@]}"
grep -a "│" "$OUT/smollm2_batch.log" | tail -3
step ceiling_8b 200 graphrt bench-spec --target llama-3-8b --workload always-match --method ngram \
  --batch-sizes 1 --num-steps 4 --max-new-tokens 128 --context 512 --device cuda --out "$OUT"
grep -a "│" "$OUT/ceiling_8b.log" | tail -3

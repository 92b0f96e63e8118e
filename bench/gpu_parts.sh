#!/usr/bin/env bash
# The GPU suite in two parts, each one device call (~3-5 min on the H100):
#   bash bench/gpu_parts.sh A|B [pytest args]   (after .gpu/install.sh; B needs the SmolLM2 GGUF)
# Logs: $OUT/suite_full.log (whole), $OUT/suite.log (tail), as bench/gpu_suite.sh writes them.
set -uo pipefail
part=${1:?A or B}
shift
A="checks_before_write capture_refusals bad_input emulated poison_dtypes mla_sparse sampler sampler_kernel spec_modes
runtime isolation dsa_spec buffers kv_safety threads ring capture_accounting fastpath fused_update skinny backend_hooks"
B="recapture models_gguf local_attention sampling dsa_runtime qk_norm_rope models_hf sliding_window
isolation_modes hf_wrap backends tp_gpu ops decode_parity soak mla_cache dsa_engine tp_checkpoints overlap bench_sampler"
case "$part" in
A) names=$A ;;
B) names=$B ;;
*) echo "part must be A or B, got $part" >&2; exit 2 ;;
esac
exec bash bench/gpu_suite.sh $(for n in $names; do find tests -name "test_$n.py"; done) "$@"

#!/usr/bin/env bash
# The decoder's attention on a GPU (sm_80 or newer), short enough for a small device budget: builds
# only strata_llm_model_tests and strata-attention-bench (for this GPU's architecture), runs the
# tensor-core attention's tests and the decoder's CUDA tests (it fails if any of them skips:
# a GPU is visible), then the bench on the 1.08 B Llama's attention shape. The build dependencies
# must be installed already (scripts/install-deps.sh). Its output ends with "attention-check:"
# lines: the tests' verdict, then ms and TFLOPS per pass and kernel.
#   scripts/attention-check.sh [build dir (default build/attention-check) [bench options]]
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "attention-check: no NVIDIA GPU visible (nvidia-smi -L failed)" >&2
  exit 2
fi
build=${1:-build/attention-check}
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
cmake --preset release -B "$build" -DSTRATA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=native >/dev/null
cmake --build "$build" -j "$(nproc)" --target strata_llm_model_tests strata-attention-bench

status=0
"$build/tests/examples/llm/strata_llm_model_tests" \
  --gtest_filter='*FlashAttentionCuda*:*DecoderCuda*' 2>&1 | tee "$log" || status=1
if grep -q "\[  SKIPPED \]" "$log"; then
  echo "attention-check: tests skipped although a GPU is visible" >&2
  status=1
fi
summary=("attention-check: tests $([[ $status == 0 ]] && echo passed || echo FAILED)")

"$build/examples/llm/strata-attention-bench" "${@:2}" | tee "$log"
while read -r _ pass kernel _ ms _ tflops; do
  summary+=("attention-check: $pass $kernel: $ms ms, $tflops TFLOPS")
done < <(grep -E '^attention-bench: (forward|backward) ' "$log")

echo
printf '%s\n' "${summary[@]}"
exit "$status"

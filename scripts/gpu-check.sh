#!/usr/bin/env bash
# On a machine with NVIDIA GPUs, one command from a clean checkout (at most 8 minutes on one H200,
# build included; it builds only what it runs):
#  1. every GPU test (CudaDevice and its kernels, the device pool, the pinned pool on cudaHostAlloc,
#     NcclComm on 1 rank and under mpirun on 2+ GPUs, the Engine's CUDA path, the GPT's and the
#     Hugging Face decoder's CUDA backends, fine-tuning on the GPU); it fails if any of them skips;
#  2. the same CUDA tests under compute-sanitizer: memcheck on all, racecheck on the kernels' tests;
#  3. h2d / d2h GB/s of pinned copies and the fused optimizer step on 1.08e9 parameters against
#     the device-to-device copy (`strata bench device`);
#  4. `strata bench step --device cuda`, 1e8 parameters, optimizer on the host and on NVMe;
#  5. fine-tuning tokens/s, achieved TFLOPS and MFU (model FLOPs / step time / the GPU's bf16 peak)
#     for all-device, optimizer-on-host and params+optimizer-on-NVMe placements, next to the host
#     device;
#  6. fine-tuning a 90 M-parameter Llama-architecture folder (strata-make-tiny-model) with
#     `strata-finetune --model --device cuda`: bf16 tensor-core products, tiled attention.
# Its output ends with one "gpu-check: <figure>: <value>" line per figure, ready for the README.
# GPU_PEAK_TFLOPS overrides the bf16 dense peak used for MFU (default 989: H100/H200 SXM).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: no NVIDIA GPU visible (nvidia-smi -L failed); nothing to check here" >&2
  exit 2
fi
nvidia-smi -L
gpus=$(nvidia-smi -L | wc -l)
peak_tflops=${GPU_PEAK_TFLOPS:-989}
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
summary=()  # the closing lines, in order
add_summary() { summary+=("gpu-check: $1"); }

./scripts/install-deps.sh
build=build/gpu-check
# CUDA ON, not AUTO: a missing toolkit fails loudly.
cmake --preset release -B "$build" -DSTRATA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=native >/dev/null
cmake --build "$build" -j "$(nproc)" --target strata strata_tiers_tests strata_comm_tests \
  strata_runtime_tests strata_gpt_tests strata_finetune_tests strata-finetune strata_nccl_mpi_tests \
  strata_llm_model_tests strata-make-tiny-model

# 1. Every CUDA test. The suites' own skip lines are counted: a GPU test that skips here means the
# GPU was not usable, which is a failure. NcclComm's multi-rank tests skip on one GPU, saying so.
cuda_filter='*Cuda*:*cuda*:*Nccl*'
run_suite() {  # suite binary, gtest filter, log
  "$build/$1" --gtest_filter="$2" 2>&1 | tee "$3"
}
run_suite tests/tiers/strata_tiers_tests "$cuda_filter" "$work/tiers.log"
run_suite tests/runtime/comm/strata_comm_tests "$cuda_filter" "$work/comm.log"
run_suite tests/runtime/strata_runtime_tests "$cuda_filter" "$work/runtime.log"
run_suite tests/examples/strata_gpt_tests "$cuda_filter" "$work/gpt.log"
run_suite tests/examples/strata_finetune_tests "$cuda_filter" "$work/finetune.log"
run_suite tests/examples/llm/strata_llm_model_tests "$cuda_filter" "$work/llm.log"
nccl_ranks=$((gpus < 4 ? gpus : 4))
if ((nccl_ranks >= 2)); then
  mpirun --allow-run-as-root --oversubscribe -np "$nccl_ranks" \
    "$build/tests/runtime/comm/strata_nccl_mpi_tests" 2>&1 | tee "$work/nccl_mpi.log"
  add_summary "NcclComm multi-rank tests: passed on $nccl_ranks GPUs"
else
  add_summary "NcclComm multi-rank tests: skipped (1 GPU: they need 2)"
fi
if grep -h "\[  SKIPPED \]" "$work"/tiers.log "$work"/comm.log "$work"/runtime.log \
  "$work"/gpt.log "$work"/finetune.log "$work"/llm.log; then
  echo "gpu-check: the GPU tests above skipped although a GPU is visible" >&2
  exit 1
fi
add_summary "GPU tests: passed, none skipped"

# 2. compute-sanitizer: memcheck on every CUDA test (leaks too), racecheck on the kernels' tests.
sanitizer=compute-sanitizer
command -v "$sanitizer" >/dev/null || sanitizer=/usr/local/cuda/bin/compute-sanitizer
sanitize() {  # tool, binary, filter
  local options=(--tool "$1" --error-exitcode 1)
  [[ $1 == memcheck ]] && options+=(--leak-check full)
  "$sanitizer" "${options[@]}" "$build/$2" --gtest_filter="$3" --gtest_brief=1
}
# The optimizer's large sizes (millions of elements x 324 cases) would take most of the time under
# memcheck; its small sizes run every kernel, aligned and not, with guards around every array.
for suite in tests/tiers/strata_tiers_tests tests/runtime/strata_runtime_tests \
  tests/examples/strata_gpt_tests tests/examples/llm/strata_llm_model_tests; do
  sanitize memcheck "$suite" "$cuda_filter-*LargeSizes*"
done
sanitize racecheck tests/tiers/strata_tiers_tests 'Backends/DeviceCastTest.*/cuda:Backends/DeviceTest.*Accumulate*/cuda:Backends/DeviceTest.Scale*/cuda:CudaOptimizer/OptimizerMatrix.*int8*grad_bf16_out_bf16:Backends/DeviceSumOfSquaresTest.*/cuda'
sanitize racecheck tests/examples/strata_gpt_tests '*GptCuda*'
sanitize racecheck tests/examples/llm/strata_llm_model_tests '*DecoderCuda*'
add_summary "compute-sanitizer: memcheck and racecheck clean"

# 3. Pinned copies.
strata="$build/runtime/strata"
"$strata" bench device --device cuda --mib 256 --iterations 20 --optimizer-params 1.08e9 |
  tee "$work/device.log"
h2d=$(awk '/^copy host->device/ {print $3}' "$work/device.log")
d2h=$(awk '/^copy device->host/ {print $3}' "$work/device.log")
add_summary "h2d pinned copy: $h2d GB/s (256 MiB)"
add_summary "d2h pinned copy: $d2h GB/s (256 MiB)"
add_summary "$(grep '^optimizer step:' "$work/device.log")"

# 4. The Engine on the GPU: 1e8 parameters (params and grads in GPU memory), optimizer state on
# the host, then on NVMe (a scratch directory on the local disk).
mkdir -p "$work/nvme"
for optimizer in host nvme; do
  cat >"$work/step-$optimizer.toml" <<EOF
[tiers.device]
kind = "cuda"
budget = "16GiB"
[tiers.host]
budget = "16GiB"
[tiers.nvme]
paths = ["$work/nvme"]
budget = "8GiB"
[zero]
stage = 3
params = "device"
grads = "device"
optimizer = "$optimizer"
EOF
  "$strata" bench step "$work/step-$optimizer.toml" --device cuda --params 1e8 \
    --unit-params 1e7 --steps 2 --overwrite --json | tee "$work/step-$optimizer.json"
  t_step=$(grep -o '"t_step_s":[0-9.e+-]*' "$work/step-$optimizer.json" | cut -d: -f2)
  add_summary "bench step, 1e8 params, optimizer on $optimizer: $t_step s/step"
done

# 5. Fine-tuning (the 25.4 M-parameter GPT of examples/configs, micro-batch 8 x 128 tokens), 10
# steps per placement on the GPU and on the host-emulated device. Model FLOPs per token: 6 N for
# the matrices plus 12 L d T for attention (forward and backward, Chinchilla / PaLM convention).
json_number() { grep -o "\"$1\": [0-9.e+-]*" "$2" | cut -d' ' -f2; }
toml_number() { awk -F'[= #]+' -v key="$1" '$1 == key {print $2; exit}' "$2"; }
for placement in all_device optimizer_host params_optimizer_nvme; do
  config="examples/configs/$placement.toml"
  layers=$(toml_number layers "$config")
  d_model=$(toml_number d_model "$config")
  seq_len=$(toml_number seq_len "$config")
  for device in cuda host; do
    out="$work/finetune-$placement-$device.json"
    echo "gpu-check: strata-finetune $placement --device $device"
    "$build/examples/finetune/strata-finetune" --config "$config" --device "$device" --steps 10 --overwrite \
      --eval-every 0 --eval-batches 1 --summary-json "$out" | grep -E "device:|^step +10 |summary"
    tokens_per_s=$(json_number tokens_per_s "$out")
    params=$(json_number params "$out")
    read -r tflops mfu < <(awk -v t="$tokens_per_s" -v n="$params" -v l="$layers" -v d="$d_model" \
      -v s="$seq_len" -v peak="$peak_tflops" \
      'BEGIN { f = t * (6 * n + 12 * l * d * s) / 1e12; printf "%.2f %.1f\n", f, 100 * f / peak }')
    if [[ $device == cuda ]]; then
      add_summary "fine-tuning $placement on cuda: $tokens_per_s tokens/s, $tflops TFLOPS, MFU $mfu% (peak $peak_tflops)"
    else
      add_summary "fine-tuning $placement on host device: $tokens_per_s tokens/s, $tflops TFLOPS"
    fi
  done
done

# 6. A Hugging Face Llama-architecture folder on the GPU: hidden 1024, 8 layers, 16 heads over 4 kv
# heads, inner 2816 (GQA, RoPE, SwiGLU), micro-batch 8 x 512 tokens, all state on the device.
"$build/examples/llm/strata-make-tiny-model" --out "$work/llama" --family llama --hidden-size 1024 \
  --intermediate-size 2816 --layers 8 --heads 16 --kv-heads 4
out="$work/finetune-llama-cuda.json"
"$build/examples/finetune/strata-finetune" --model "$work/llama" --config examples/configs/all_device.toml \
  --device cuda --seq-len 512 --micro-batch 8 --steps 10 --overwrite --eval-every 0 --eval-batches 1 \
  --summary-json "$out" | grep -E "device:|^step +10 |summary"
tokens_per_s=$(json_number tokens_per_s "$out")
params=$(json_number params "$out")
read -r tflops mfu < <(awk -v t="$tokens_per_s" -v n="$params" -v l=8 -v d=1024 -v s=512 \
  -v peak="$peak_tflops" \
  'BEGIN { f = t * (6 * n + 12 * l * d * s) / 1e12; printf "%.2f %.1f\n", f, 100 * f / peak }')
add_summary "fine-tuning a $params-parameter Llama folder (--model) on cuda: $tokens_per_s tokens/s, $tflops TFLOPS, MFU $mfu%"

echo
printf '%s\n' "${summary[@]}"

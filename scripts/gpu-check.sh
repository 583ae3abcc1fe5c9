#!/usr/bin/env bash
# On a machine with NVIDIA GPUs: builds with CUDA (ON, not AUTO: a missing toolkit fails loudly),
# runs every GPU test (CudaDevice, its kernels, the pinned pool on cudaHostAlloc, NcclComm, the
# Engine's CUDA path in EngineCuda.*, the GPT's CUDA backend against its host model, fine-tuning on
# the GPU), the device throughput benchmark, `strata bench step --device cuda` (params and
# gradients in GPU memory, the optimizer on the host and on NVMe through pinned staging) and a
# short fine-tuning run on the GPU next to the same run on the host device, in well under 5
# minutes. Prints what it measured.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: no NVIDIA GPU visible (nvidia-smi -L failed); nothing to check here" >&2
  exit 2
fi
nvidia-smi -L
./scripts/install-deps.sh
cmake --preset release -DSTRATA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=native >/dev/null
cmake --build --preset release -j "$(nproc)" --target strata strata_tiers_tests strata_comm_tests \
  strata_runtime_tests strata_gpt_tests strata_finetune_tests strata-finetune
# Every CUDA-parameterised test; a skip here would mean the GPU was not usable.
ctest --test-dir build/release -R 'cuda|Cuda|Nccl' --output-on-failure -j 1 | tee /tmp/gpu-check-ctest.log
if grep -q "Skipped" /tmp/gpu-check-ctest.log; then
  echo "gpu-check: some GPU tests skipped although a GPU is visible" >&2
  exit 1
fi
./build/release/runtime/strata bench device --device cuda --mib 256 --iterations 20
# The fine-tuning example (25.4 M parameters, micro-batch 8 × 128 tokens), parameters and
# gradients on the device, optimizer on the host: 10 steps on the GPU (cuBLAS and the model's
# kernels), then the same config and steps on the host-emulated device (OpenBLAS).
for device in cuda host; do
  echo "gpu-check: strata-finetune --device $device"
  ./build/release/examples/finetune/strata-finetune --config examples/configs/optimizer_host.toml \
    --device "$device" --steps 10 --eval-every 0 --eval-batches 1 \
    --summary-json "/tmp/gpu-check-finetune-$device.json" | grep -E "device:|^step +10 |summary"
done
for device in cuda host; do
  echo "gpu-check: fine-tuning tokens/s on $device:" \
    "$(grep -o '"tokens_per_s": [0-9.e+-]*' "/tmp/gpu-check-finetune-$device.json" | cut -d' ' -f2)"
done
# The Engine on the GPU: 1e8 parameters (params and grads in GPU memory), optimizer state on the
# host, then on NVMe (a scratch directory on the local disk).
bench_dir="$(mktemp -d)"
trap 'rm -rf "$bench_dir"' EXIT
mkdir -p "$bench_dir/nvme"
for optimizer in host nvme; do
  cat >"$bench_dir/step-$optimizer.toml" <<EOF
[tiers.device]
kind = "cuda"
budget = "16GiB"
[tiers.host]
budget = "16GiB"
[tiers.nvme]
paths = ["$bench_dir/nvme"]
budget = "8GiB"
[zero]
stage = 3
params = "device"
grads = "device"
optimizer = "$optimizer"
EOF
  ./build/release/runtime/strata bench step "$bench_dir/step-$optimizer.toml" --device cuda \
    --params 1e8 --unit-params 1e7 --steps 2 --overwrite
done

#!/usr/bin/env bash
# On a machine with NVIDIA GPUs: builds with CUDA (ON, not AUTO: a missing toolkit fails loudly),
# runs every GPU test (CudaDevice, its kernels, the pinned pool on cudaHostAlloc, NcclComm) and
# the device throughput benchmark, in well under 5 minutes. Prints what it measured. The Engine's
# CUDA path runs in EngineCuda.* and in `strata bench step --device cuda` (params and gradients in
# GPU memory, the optimizer on the host and on NVMe through pinned staging).
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
  strata_runtime_tests
# Every CUDA-parameterised test; a skip here would mean the GPU was not usable.
ctest --test-dir build/release -R 'cuda|Cuda|Nccl' --output-on-failure -j 1 | tee /tmp/gpu-check-ctest.log
if grep -q "Skipped" /tmp/gpu-check-ctest.log; then
  echo "gpu-check: some GPU tests skipped although a GPU is visible" >&2
  exit 1
fi
./build/release/runtime/strata bench device --device cuda --mib 256 --iterations 20
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
    --params 1e8 --unit-params 1e7 --steps 2
done

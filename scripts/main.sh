#!/usr/bin/env bash
# README's main job: installs missing dependencies, builds strata (release preset), prints the
# memory plan, and fine-tunes a 25.4 M-parameter GPT on the licence texts of this machine with
# parameters and optimizer state on NVMe (host budget 128 MiB, far below the 407 MB of state).
# It builds only the two programs it runs; `--python` also builds the Python module
# (build/release/python: docs/python.md). CUDA is compiled when a GPU is present (nvidia-smi lists
# one), not merely because nvcc is installed: without a GPU the demo runs on the host device.
# Other arguments go to strata-finetune (e.g. --steps 100 --trace trace.json). A re-run starts
# the demo afresh over the previous run's NVMe store (--overwrite), unless --resume is passed.
set -euo pipefail
cd "$(dirname "$0")/.."
targets=(strata strata-finetune)
finetune_args=()
start=--overwrite
for argument in "$@"; do
  case $argument in
    --python) targets+=(strata_python) ;;
    --resume) start="" finetune_args+=("$argument") ;;
    *) finetune_args+=("$argument") ;;
  esac
done
cuda=OFF
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then cuda=AUTO; fi
./scripts/install-deps.sh
cmake --preset release -DSTRATA_CUDA="$cuda" >/dev/null
cmake --build --preset release -j "$(nproc)" --target "${targets[@]}"
config=examples/configs/params_optimizer_nvme.toml
./build/release/runtime/strata plan "$config" | sed -n '/^tier/,/^NVMe/p'
exec ./build/release/examples/finetune/strata-finetune --config "$config" --steps 40 --eval-every 10 \
  ${start:+"$start"} ${finetune_args[@]+"${finetune_args[@]}"}

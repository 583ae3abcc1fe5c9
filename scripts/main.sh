#!/usr/bin/env bash
# README's main job: installs missing dependencies, builds strata (release preset), prints the
# memory plan, and fine-tunes a 25.4 M-parameter GPT on the licence texts of this machine with
# parameters and optimizer state on NVMe (host budget 128 MiB, far below the 407 MB of state).
# It also builds the Python module (build/release/python: docs/python.md).
# Extra arguments go to strata-finetune (e.g. --steps 100 --trace trace.json). A re-run starts
# the demo afresh over the previous run's NVMe store (--overwrite), unless --resume is passed.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)" --target strata strata-finetune strata_python
config=examples/configs/params_optimizer_nvme.toml
./build/release/runtime/strata plan "$config" | sed -n '/^tier/,/^NVMe/p'
start=--overwrite
for argument in "$@"; do [[ $argument == --resume ]] && start=""; done
exec ./build/release/examples/finetune/strata-finetune --config "$config" --steps 40 --eval-every 10 \
  ${start:+"$start"} "$@"

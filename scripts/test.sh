#!/usr/bin/env bash
# README's test command: installs missing dependencies, builds the CI preset (release, -Werror, CUDA
# compiled when nvcc is found) and runs the whole CTest suite.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
cmake --preset ci >/dev/null
cmake --build --preset ci -j "$(nproc)"
ctest --preset ci -j "$(nproc)"

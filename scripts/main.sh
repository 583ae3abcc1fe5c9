#!/usr/bin/env bash
# README's main job: installs missing dependencies, builds strata (release preset) and prints the
# memory plan of the default config. Extra arguments go to `strata plan`.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)" --target strata
./build/release/runtime/strata plan examples/configs/default.toml "$@"

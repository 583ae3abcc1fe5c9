#!/usr/bin/env bash
# Installs every Debian 12 package that strata's build, tests, examples and benchmarks need.
# (pybind11-dev, python3-dev: the Python module; python3-torch: its tests and benchmark.)
# Idempotent: installs only what is missing, and runs `apt-get update` at most once.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  liburing-dev libtbb-dev libxsimd-dev libtomlplusplus-dev libcli11-dev
  libspdlog-dev libfmt-dev nlohmann-json3-dev libxxhash-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libopenmpi-dev openmpi-bin libopenblas-dev
  fio clang libclang-rt-14-dev
  pybind11-dev python3-dev python3-torch
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"

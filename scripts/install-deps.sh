#!/usr/bin/env bash
# Installs every Debian 12 package that strata's build, tests, examples and benchmarks need, then
# the npm packages of the tokenizer tests' reference (scripts/install-npm-test-deps.sh).
# (ccache: a rebuild compiles only what changed, in every preset; pybind11-dev, python3-dev: the
# Python module; python3-torch: the model and Python tests' reference; PCRE2, ICU, sentencepiece:
# the tokenizers; nodejs: the tokenizer reference.)
# Idempotent: installs only what is missing, and runs `apt-get update` at most once.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  liburing-dev libtbb-dev libxsimd-dev libtomlplusplus-dev libcli11-dev
  libspdlog-dev libfmt-dev nlohmann-json3-dev libxxhash-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libopenmpi-dev openmpi-bin libopenblas-dev
  fio clang libclang-rt-14-dev ccache
  python3-torch pybind11-dev python3-dev
  libpcre2-dev libicu-dev libsentencepiece-dev nodejs
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
updated=0
apt_install() {
  if [ "$updated" -eq 0 ]; then
    $sudo apt-get update -qq
    updated=1
  fi
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
else
  echo "install-deps: installing ${missing[*]}"
  apt_install "${missing[@]}"
  echo "install-deps: done"
fi
# Debian's nodejs comes without npm (its own package); NodeSource's nodejs bundles it, and Debian's
# npm would conflict with that one, so npm is installed only when no npm is on PATH.
if ! command -v npm >/dev/null 2>&1; then
  echo "install-deps: installing npm"
  apt_install npm
fi
"$(dirname "$0")/install-npm-test-deps.sh"

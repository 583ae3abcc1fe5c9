#!/usr/bin/env bash
# Builds, on this machine (no GPU needed), everything scripts/gpu-check.sh runs on a GPU machine
# that has the CUDA libraries but none of strata's other dependencies and no package registry,
# and packs it under .gpu-bundle/ (git-ignored), small enough to travel with the checkout:
#   .gpu-bundle/bin.tar.xz   the programs and test suites, stripped, at their build-tree paths
#   .gpu-bundle/lib.tar.xz   the shared libraries they load that such a machine lacks (ldd's list
#                            less glibc, libstdc++, libgcc_s and the CUDA, cuBLAS, cuDNN and NCCL
#                            libraries, which it has; one process never initialises MPI, so Open
#                            MPI's plugins stay behind)
#   .gpu-bundle/manifest     the source path the tests were compiled with, the commit, the targets
# Then, on the GPU machine, from a copy of the same checkout: scripts/gpu-check.sh unpacks it.
#   scripts/gpu-bundle.sh              # CUDA architecture 90 (H100, H200); GPU_ARCH=80 for A100
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
arch=${GPU_ARCH:-90}
build=build/gpu
out=.gpu-bundle
targets=(strata strata-finetune strata-make-tiny-model strata-eval strata-generate strata-attention-bench
         strata-kernel-bench strata_tiers_tests strata_runtime_tests strata_gpt_tests
         strata_finetune_tests strata_llm_model_tests strata_llm_tests)

./scripts/install-deps.sh
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
# CUDA ON, not AUTO: a missing toolkit fails here, not on the GPU machine.
cmake --preset release -B "$build" -DSTRATA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" \
  "${launcher[@]}" >/dev/null
cmake --build "$build" -j "$(nproc)" --target "${targets[@]}"

rm -rf "$out"
mkdir -p "$out/stage/bin" "$out/stage/lib"
binaries=()
for target in "${targets[@]}"; do
  path=$(find "$build" -type f -name "$target" -perm -u+x | head -n 1)
  [[ -n $path ]] || { echo "gpu-bundle: built no $target under $build" >&2; exit 1; }
  binaries+=("$path")
  mkdir -p "$out/stage/bin/$(dirname "$path")"
  strip --strip-debug -o "$out/stage/bin/$path" "$path"
done

# The libraries a GPU machine's image has: the C and C++ runtimes, and CUDA's own.
has_it='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libcudnn.*|libnccl|libnvrtc|libnvJitLink)\.so'
for binary in "${binaries[@]}"; do
  ldd "$binary" | awk '$3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  if [[ $name =~ $has_it ]]; then continue; fi
  cp -L "$path" "$out/stage/lib/$name"
done
# The training text the check fine-tunes on (the GPU machine's image may not ship it).
mkdir -p "$out/stage/bin/$build/data"
cp -r /usr/share/common-licenses "$out/stage/bin/$build/data/common-licenses"

{
  echo "source_dir=$root"
  echo "build_dir=$build"
  echo "commit=$(git rev-parse HEAD)$(git diff --quiet HEAD -- . || echo -dirty)"
  echo "cuda_architectures=$arch"
  echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "targets=${targets[*]}"
} >"$out/manifest"
tar -C "$out/stage/bin" -cJf "$out/bin.tar.xz" .
tar -C "$out/stage/lib" -cJf "$out/lib.tar.xz" .
rm -rf "$out/stage"
du -sh "$out"/*.tar.xz
total=$(du -cb "$out"/*.tar.xz | awk 'END {print $1}')
if ((total > 60 * 1024 * 1024)); then
  echo "gpu-bundle: $total bytes: over the 60 MiB a device call can carry beside the tree" >&2
  exit 1
fi
echo "gpu-bundle: $out ($((total / 1024 / 1024)) MiB) for $(git rev-parse --short HEAD); on the GPU machine run scripts/gpu-check.sh"

// The avx512 kernel table; this file alone is compiled with -mavx512f -mavx512bw -mavx512dq
// -mavx512vl -mfma -mf16c (see CMakeLists.txt).
#include "cpu_adam/detail/kernel_impl.hpp"

namespace strata::cpu_adam::detail {

const KernelTable& avx512_kernels() {
  // The norm uses 256-bit vectors: on Zen 4 (512-bit ops double-pumped) it runs twice as fast on
  // cache-hot gradients as the 512-bit version (4.4 vs 8.9 ms per 100 M fp32), and it gives the
  // same bits whatever the width.
  static const KernelTable table =
      make_kernel_table<VectorOps<xsimd::avx512bw>, VectorOps<xsimd::fma3<xsimd::avx2>>>(
          SimdLevel::kAvx512);
  return table;
}

}  // namespace strata::cpu_adam::detail

// The avx512 kernel table; this file alone is compiled with -mavx512f -mavx512bw -mavx512dq
// -mavx512vl -mfma -mf16c (see CMakeLists.txt).
#include "cpu_adam/detail/kernel_impl.hpp"

namespace strata::cpu_adam::detail {

const KernelTable& avx512_kernels() {
  // 512-bit update, 256-bit norm (faster on Zen 4, same bits; see Norm256Ops).
  static const KernelTable table =
      make_kernel_table<VectorOps<xsimd::avx512bw>, Norm256Ops>(SimdLevel::kAvx512);
  return table;
}

}  // namespace strata::cpu_adam::detail

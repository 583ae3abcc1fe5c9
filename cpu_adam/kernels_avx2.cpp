// The avx2 kernel table; this file alone is compiled with -mavx2 -mfma -mf16c (see CMakeLists.txt).
#include "cpu_adam/detail/kernel_impl.hpp"

namespace strata::cpu_adam::detail {

const KernelTable& avx2_kernels() {
  static const KernelTable table =
      make_kernel_table<VectorOps<xsimd::fma3<xsimd::avx2>>, Norm256Ops>(SimdLevel::kAvx2);
  return table;
}

}  // namespace strata::cpu_adam::detail

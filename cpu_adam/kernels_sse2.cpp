// The sse2 kernel table; this file alone is compiled with the x86-64 baseline (SSE2) (see
// CMakeLists.txt).
#include "cpu_adam/detail/kernel_impl.hpp"

namespace strata::cpu_adam::detail {

const KernelTable& sse2_kernels() {
  static const KernelTable table = make_kernel_table<VectorOps<xsimd::sse2>>(SimdLevel::kSse2);
  return table;
}

}  // namespace strata::cpu_adam::detail

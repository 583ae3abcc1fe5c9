// The avx512 kernel table; this file alone is compiled with -mavx512f -mavx512bw -mavx512dq
// -mavx512vl (see CMakeLists.txt).
#include "cpu_adam/detail/kernel_impl.hpp"

namespace strata::cpu_adam::detail {

const KernelTable& avx512_kernels() {
  static const KernelTable table =
      make_kernel_table<VectorOps<xsimd::avx512bw>>(SimdLevel::kAvx512);
  return table;
}

}  // namespace strata::cpu_adam::detail

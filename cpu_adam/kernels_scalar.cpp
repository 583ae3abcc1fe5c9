// The scalar kernel table; this file alone is compiled with the baseline flags of the build (see
// CMakeLists.txt).
#include "cpu_adam/detail/kernel_impl.hpp"

namespace strata::cpu_adam::detail {

const KernelTable& scalar_kernels() {
  static const KernelTable table = make_kernel_table<ScalarOps>(SimdLevel::kScalar);
  return table;
}

}  // namespace strata::cpu_adam::detail

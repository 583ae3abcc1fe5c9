// Compatibility only: removed once the Engine files (runtime/engine*, checkpoint, optimizer_step)
// adopt strata::DType (base/dtype.hpp) and cpu_adam/typed_span.hpp. The element type, its names,
// sizes and conversions now live in base/; cpu_adam::Dtype is that same type.
#pragma once

#include "base/dtype.hpp"
#include "cpu_adam/typed_span.hpp"

namespace strata::cpu_adam {

using Dtype = DType;
using strata::dtype_bytes;

}  // namespace strata::cpu_adam

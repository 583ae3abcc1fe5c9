// Element-type conversion and in-place scaling of host spans, SIMD-dispatched and parallel.
// Conversions round to nearest even exactly as to_bf16()/to_fp16() in dtype.hpp do, at every
// SIMD level. Threads: work runs in `arena`; spans must not overlap.
#pragma once

#include <oneapi/tbb/task_arena.h>

#include "cpu_adam/typed_span.hpp"
#include "cpu_adam/exec_options.hpp"

namespace strata::cpu_adam {

// destination[i] = source[i] converted; same count; a same-dtype call is a copy.
void convert(ConstTypedSpan source, TypedSpan destination, tbb::task_arena& arena,
             const ExecOptions& options = {});

// data[i] = data[i] * factor (rounded back to data's dtype).
void scale_in_place(TypedSpan data, float factor, tbb::task_arena& arena,
                    const ExecOptions& options = {});

}  // namespace strata::cpu_adam

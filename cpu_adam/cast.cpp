#include "cpu_adam/cast.hpp"

#include <cstring>

#include "base/assert.hpp"
#include "cpu_adam/detail/kernel_table.hpp"
#include "cpu_adam/detail/parallel.hpp"

namespace strata::cpu_adam {

void convert(ConstTypedSpan source, TypedSpan destination, tbb::task_arena& arena,
             const ExecOptions& options) {
  STRATA_ASSERT(source.count == destination.count, "convert: counts differ");
  STRATA_ASSERT(source.count == 0 || (source.present() && destination.present()));
  const std::size_t element_bytes = dtype_bytes(source.dtype);
  if (source.dtype == destination.dtype) {
    const auto* from = static_cast<const unsigned char*>(source.data);
    auto* to = static_cast<unsigned char*>(destination.data);
    detail::for_each_chunk(arena, source.count, options.chunk_elems,
                           [&](std::size_t begin, std::size_t end) {
                             std::memcpy(to + begin * element_bytes, from + begin * element_bytes,
                                         (end - begin) * element_bytes);
                           });
    return;
  }
  const detail::ConvertFn fn =
      detail::kernels_for(options)
          .convert[static_cast<int>(source.dtype)][static_cast<int>(destination.dtype)];
  detail::for_each_chunk(
      arena, source.count, options.chunk_elems,
      [&](std::size_t begin, std::size_t end) { fn(source.data, destination.data, begin, end); });
}

void scale_in_place(TypedSpan data, float factor, tbb::task_arena& arena,
                    const ExecOptions& options) {
  STRATA_ASSERT(data.count == 0 || data.present());
  const detail::ScaleFn fn = detail::kernels_for(options).scale[static_cast<int>(data.dtype)];
  detail::for_each_chunk(
      arena, data.count, options.chunk_elems,
      [&](std::size_t begin, std::size_t end) { fn(data.data, factor, begin, end); });
}

}  // namespace strata::cpu_adam

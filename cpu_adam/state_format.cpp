#include "cpu_adam/state_format.hpp"

#include "base/assert.hpp"
#include "cpu_adam/detail/kernel_table.hpp"
#include "cpu_adam/detail/parallel.hpp"
#include "cpu_adam/detail/state_codec.hpp"

namespace strata::cpu_adam {
namespace {

// int8 works in whole blocks; the others in blocks of the same size, for one code path.
template <class Fn>
void for_each_block(std::uint64_t numel, tbb::task_arena& arena, const ExecOptions& options,
                    const Fn& fn) {
  const std::uint64_t blocks = (numel + kQuantBlockElems - 1) / kQuantBlockElems;
  const std::size_t chunk_blocks = std::max<std::size_t>(1, options.chunk_elems / kQuantBlockElems);
  detail::for_each_chunk(arena, blocks, chunk_blocks, [&](std::size_t begin, std::size_t end) {
    for (std::size_t b = begin; b < end; ++b) {
      const std::uint64_t first = b * kQuantBlockElems;
      fn(first, std::min<std::uint64_t>(kQuantBlockElems, numel - first));
    }
  });
}

}  // namespace

std::string_view state_dtype_name(StateDType dtype) {
  switch (dtype) {
    case StateDType::kFp32:
      return "fp32";
    case StateDType::kBf16:
      return "bf16";
    case StateDType::kInt8:
      return "int8";
  }
  return "?";
}

std::optional<StateDType> parse_state_dtype(std::string_view text) {
  for (StateDType dtype : {StateDType::kFp32, StateDType::kBf16, StateDType::kInt8}) {
    if (text == state_dtype_name(dtype)) return dtype;
  }
  return std::nullopt;
}

std::uint64_t state_bytes(StateDType dtype, std::uint64_t numel) {
  switch (dtype) {
    case StateDType::kFp32:
      return numel * 4;
    case StateDType::kBf16:
      return numel * 2;
    case StateDType::kInt8:
      return (numel + kQuantBlockElems - 1) / kQuantBlockElems * kQuantBlockBytes;
  }
  return 0;
}

void decode_state(StateDType dtype, MomentKind moment, const std::byte* encoded,
                  std::uint64_t numel, float* values, tbb::task_arena& arena,
                  const ExecOptions& options) {
  STRATA_ASSERT(numel == 0 || (encoded != nullptr && values != nullptr));
  const detail::DecodeFn decode = detail::kernels_for(options).decode;
  for_each_block(numel, arena, options, [&](std::uint64_t first, std::size_t n) {
    decode(dtype, moment, encoded, first, n, values + first);
  });
}

void encode_state(StateDType dtype, MomentKind moment, const float* values, std::uint64_t numel,
                  std::byte* encoded, tbb::task_arena& arena, const ExecOptions& options) {
  STRATA_ASSERT(numel == 0 || (encoded != nullptr && values != nullptr));
  const detail::EncodeFn encode = detail::kernels_for(options).encode;
  for_each_block(numel, arena, options, [&](std::uint64_t first, std::size_t n) {
    encode(dtype, moment, values + first, first, n, encoded);
  });
}

void add_compensation(const std::byte* low, std::uint64_t numel, float* values,
                      tbb::task_arena& arena, const ExecOptions& options) {
  STRATA_ASSERT(numel == 0 || (low != nullptr && values != nullptr));
  const auto* parts = reinterpret_cast<const Bf16*>(low);
  for_each_block(numel, arena, options, [&](std::uint64_t first, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      values[first + i] =
          detail::ScalarOps::add_nonzero(values[first + i], detail::ScalarOps::load(parts + first + i));
    }
  });
}

void split_compensated(const float* values, std::uint64_t numel, std::byte* weights,
                       std::byte* low, tbb::task_arena& arena, const ExecOptions& options) {
  STRATA_ASSERT(numel == 0 || (values != nullptr && weights != nullptr && low != nullptr));
  for_each_block(numel, arena, options, [&](std::uint64_t first, std::size_t n) {
    detail::split_compensated<detail::ScalarOps>(values + first, n,
                                                 reinterpret_cast<Bf16*>(weights) + first,
                                                 reinterpret_cast<Bf16*>(low) + first);
  });
}

}  // namespace strata::cpu_adam

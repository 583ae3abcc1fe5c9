#include "cpu_adam/grad_norm.hpp"

#include <algorithm>
#include <cmath>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/parallel_invoke.h>

#include "base/assert.hpp"
#include "cpu_adam/detail/kernel_table.hpp"
#include "cpu_adam/detail/parallel.hpp"

namespace strata::cpu_adam {
namespace {

constexpr std::size_t kLeafBlocks = kNormLeafBlocks;  // norm_shape.hpp

struct NormJob {
  detail::NormFn norm;
  const void* data;
  std::size_t count;

  double block(std::size_t index) const {
    const std::size_t begin = index * kNormBlockElems;
    return norm(data, begin, std::min(count, begin + kNormBlockElems));
  }

  // Sum over blocks [first, last): sequential within a leaf, halves added at every inner node.
  double reduce(std::size_t first, std::size_t last, bool parallel) const {
    if (last - first <= kLeafBlocks) {
      double sum = 0.0;
      for (std::size_t b = first; b < last; ++b) sum += block(b);
      return sum;
    }
    const std::size_t middle = first + (last - first) / 2;
    double low = 0.0;
    double high = 0.0;
    if (parallel) {
      tbb::parallel_invoke([&] { low = reduce(first, middle, true); },
                           [&] { high = reduce(middle, last, true); });
    } else {
      low = reduce(first, middle, false);
      high = reduce(middle, last, false);
    }
    return low + high;
  }

  std::size_t blocks() const { return (count + kNormBlockElems - 1) / kNormBlockElems; }
};

NormJob make_job(ConstTypedSpan grad, const ExecOptions& options) {
  STRATA_ASSERT(grad.count == 0 || grad.present(), "grad data missing");
  return NormJob{detail::kernels_for(options).norm[static_cast<int>(grad.dtype)], grad.data,
                 grad.count};
}

}  // namespace

double sum_of_squares(ConstTypedSpan grad, tbb::task_arena& arena, const ExecOptions& options) {
  const NormJob job = make_job(grad, options);
  const std::size_t blocks = job.blocks();
  if (blocks <= kLeafBlocks) return job.reduce(0, blocks, false);
  double sum = 0.0;
  arena.execute([&] { sum = job.reduce(0, blocks, true); });
  return sum;
}

GradNormAccumulator::GradNormAccumulator(const ExecOptions& options) : options_(options) {}

void GradNormAccumulator::add(ConstTypedSpan grad, tbb::task_arena& arena) {
  sum_of_squares_ += cpu_adam::sum_of_squares(grad, arena, options_);
}

void GradNormAccumulator::add(std::span<const ConstTypedSpan> grads, tbb::task_arena& arena) {
  // Spans are reduced in parallel (each with its own fixed tree), then added in order: the same
  // bits as adding them one by one, with many small spans spread over the threads.
  if (span_sums_.size() < grads.size()) span_sums_.resize(grads.size());
  arena.execute([&] {
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, grads.size()),
                      [&](const tbb::blocked_range<std::size_t>& range) {
                        for (std::size_t k = range.begin(); k < range.end(); ++k) {
                          const NormJob job = make_job(grads[k], options_);
                          span_sums_[k] = job.reduce(0, job.blocks(), true);
                        }
                      });
  });
  for (std::size_t k = 0; k < grads.size(); ++k) sum_of_squares_ += span_sums_[k];
}

void GradNormAccumulator::add_serial(ConstTypedSpan grad) {
  const NormJob job = make_job(grad, options_);
  sum_of_squares_ += job.reduce(0, job.blocks(), false);
}

double GradNormAccumulator::norm() const {
  return std::sqrt(sum_of_squares_);
}

bool GradNormAccumulator::non_finite() const {
  return !std::isfinite(sum_of_squares_);
}

double clip_coefficient(double grad_norm, double max_norm) {
  if (!std::isfinite(grad_norm)) return 0.0;
  return std::min(1.0, max_norm / (grad_norm + 1e-6));
}

}  // namespace strata::cpu_adam

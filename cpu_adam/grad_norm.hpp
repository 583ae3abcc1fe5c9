// The global gradient L2 norm and the non-finite check, for clipping and the fp16 overflow skip.
// Feed it every gradient span of the step, either all at once after backward or one span at a time
// as each gradient lands in host memory (while it is still in cache: no extra pass over DRAM).
//
// Contract
//  - Sums squares in double: x*x is exact for every fp32/bf16/fp16 x, and the sum cannot overflow
//    for finite inputs, so "the sum is not finite" is exactly "some gradient is inf or NaN".
//  - Deterministic: a span's sum is reduced over fixed blocks of kNormBlockElems in a fixed tree
//    (norm_shape.hpp; whatever the thread count or SIMD level); span sums are added in the order
//    they are fed.
//    Feeding the same spans in the same order gives the same bits.
//  - Not thread-safe: one accumulator per feeder. add_serial() runs on the calling thread (for an
//    I/O or copy completion path); add() spreads one span over `arena`.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include <oneapi/tbb/task_arena.h>

#include "cpu_adam/norm_shape.hpp"
#include "cpu_adam/typed_span.hpp"
#include "cpu_adam/exec_options.hpp"

namespace strata::cpu_adam {

class GradNormAccumulator {
 public:
  explicit GradNormAccumulator(const ExecOptions& options = {});

  // One span, spread over `arena`.
  void add(ConstTypedSpan grad, tbb::task_arena& arena);
  // Many spans in one parallel pass (small spans run side by side); the same bits as adding them
  // one by one in this order. Allocates only when given more spans than ever before.
  void add(std::span<const ConstTypedSpan> grads, tbb::task_arena& arena);
  // One span on the calling thread.
  void add_serial(ConstTypedSpan grad);

  // Sum of squares of every element fed since construction or reset(), in the gradients' units
  // (divide the norm by the loss scale for the unscaled norm).
  double sum_of_squares() const { return sum_of_squares_; }
  double norm() const;
  bool non_finite() const;
  void reset() { sum_of_squares_ = 0.0; }

 private:
  ExecOptions options_;
  double sum_of_squares_ = 0.0;
  std::vector<double> span_sums_;  // per-span sums of the last multi-span add()
};

// Sum of squares of one span with the accumulator's fixed blocking (what add() adds).
double sum_of_squares(ConstTypedSpan grad, tbb::task_arena& arena, const ExecOptions& options = {});

// torch.nn.utils.clip_grad_norm_'s coefficient: max_norm / (norm + 1e-6), capped at 1. A
// non-finite norm gives 0 (the step should be skipped; see non_finite()).
double clip_coefficient(double grad_norm, double max_norm);

}  // namespace strata::cpu_adam

#include "tiers/device/host_optimizer.hpp"

#include <span>

#include "cpu_adam/compressed_step.hpp"
#include "cpu_adam/grad_norm.hpp"

namespace strata::tiers::detail {

void run_on_host(const OptimizerOp& op, tbb::task_arena& arena) {
  cpu_adam::CompressedSpans spans;
  spans.numel = op.numel;
  spans.master_dtype = op.master_dtype;
  spans.moment_dtype = op.moment_dtype;
  spans.master = static_cast<std::byte*>(op.master);
  spans.compensation = static_cast<std::byte*>(op.compensation);
  spans.exp_avg = static_cast<std::byte*>(op.exp_avg);
  spans.exp_avg_sq = static_cast<std::byte*>(op.exp_avg_sq);
  spans.grad = cpu_adam::ConstTypedSpan(op.grad, op.numel, op.grad_dtype);
  if (op.param_out != nullptr) {
    spans.param_out = cpu_adam::TypedSpan(op.param_out, op.numel, op.param_out_dtype);
  }
  cpu_adam::step_compressed(op.plan, spans,
                            std::span(op.decay_runs, static_cast<std::size_t>(op.decay_run_count)),
                            arena);
}

void run_on_host(const SumOfSquaresOp& op, tbb::task_arena& arena) {
  if (op.count == 0) return;  // as on CUDA, which launches nothing
  // GradNormAccumulator::add's addition: the span's sum, then one add into the running sum.
  *op.sum +=
      cpu_adam::sum_of_squares(cpu_adam::ConstTypedSpan(op.src, op.count, op.src_type), arena);
}

}  // namespace strata::tiers::detail

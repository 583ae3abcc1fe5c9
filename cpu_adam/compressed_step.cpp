#include "cpu_adam/compressed_step.hpp"

#include <stdexcept>
#include <string>

#include "base/assert.hpp"
#include "cpu_adam/detail/kernel_table.hpp"
#include "cpu_adam/detail/parallel.hpp"
#include "cpu_adam/detail/state_codec.hpp"
#include "cpu_adam/detail/update_setup.hpp"
#include "cpu_adam/rounding_hash.hpp"

namespace strata::cpu_adam {
namespace {

void check_spans(UpdateRule rule, const CompressedSpans& spans) {
  if (spans.master_dtype == StateDType::kInt8) {
    throw std::invalid_argument("cpu_adam: master weights must be fp32 or bf16, got int8");
  }
  if (spans.compensation != nullptr && spans.master_dtype != StateDType::kBf16) {
    throw std::invalid_argument("cpu_adam: a Kahan compensation needs bf16 master weights, got " +
                                std::string(state_dtype_name(spans.master_dtype)));
  }
  STRATA_ASSERT(spans.grad.count == spans.numel, "grad length differs from numel");
  STRATA_ASSERT(spans.numel == 0 || (spans.master != nullptr && spans.grad.present()),
                "master or grad missing");
  STRATA_ASSERT(!rule_uses_exp_avg(rule) || spans.numel == 0 || spans.exp_avg != nullptr,
                "exp_avg missing");
  STRATA_ASSERT(!rule_uses_exp_avg_sq(rule) || spans.numel == 0 || spans.exp_avg_sq != nullptr,
                "exp_avg_sq missing");
  STRATA_ASSERT(!spans.param_out.present() || spans.param_out.count == spans.numel,
                "param_out length differs from numel");
}

void check_runs(std::span<const DecayRun> runs, std::uint64_t numel) {
  std::uint64_t next = 0;
  for (const DecayRun& run : runs) {
    STRATA_ASSERT(run.begin == next, "decay runs must tile the sub-group in order");
    next = run.begin + run.numel;
  }
  STRATA_ASSERT(runs.empty() || next == numel, "decay runs must cover the sub-group");
}

}  // namespace

StepPlan plan_step(const Hyperparams& hyperparams, const GradScaling& scaling,
                   const StochasticRounding& rounding) {
  validate(hyperparams, scaling);
  StepPlan plan;
  plan.rule = detail::rule_of(hyperparams.algorithm);
  plan.with_decay = detail::make_constants(hyperparams, scaling);
  Hyperparams no_decay = hyperparams;
  no_decay.weight_decay = 0;
  plan.without_decay = detail::make_constants(no_decay, scaling);
  plan.rounding_key = rounding_key(rounding.seed, static_cast<std::uint64_t>(hyperparams.step));
  plan.first_element = rounding.first_element;
  return plan;
}

void step_compressed(const Hyperparams& hyperparams, const CompressedSpans& spans,
                     const GradScaling& scaling, const StochasticRounding& rounding,
                     std::span<const DecayRun> decay_runs, tbb::task_arena& arena,
                     const ExecOptions& options) {
  step_compressed(plan_step(hyperparams, scaling, rounding), spans, decay_runs, arena, options);
}

void step_compressed(const StepPlan& plan, const CompressedSpans& spans,
                     std::span<const DecayRun> decay_runs, tbb::task_arena& arena,
                     const ExecOptions& options) {
  check_spans(plan.rule, spans);
  check_runs(decay_runs, spans.numel);
  detail::CompressedArgs args;
  args.master = spans.master;
  args.compensation = spans.compensation;
  args.exp_avg = rule_uses_exp_avg(plan.rule) ? spans.exp_avg : nullptr;
  args.exp_avg_sq = rule_uses_exp_avg_sq(plan.rule) ? spans.exp_avg_sq : nullptr;
  args.grad = spans.grad.data;
  args.param_out = spans.param_out.data;
  args.numel = spans.numel;
  args.master_dtype = spans.master_dtype;
  args.moment_dtype = spans.moment_dtype;
  args.with_decay = plan.with_decay;
  args.without_decay = plan.without_decay;
  args.runs = decay_runs.data();
  args.run_count = decay_runs.size();
  args.rounding_key = plan.rounding_key;
  args.first_element = plan.first_element;
  const detail::CompressedFn update = detail::kernels_for(options).compressed[static_cast<int>(
      plan.rule)][static_cast<int>(spans.grad.dtype)][detail::out_index(spans.param_out)];
  const std::uint64_t blocks = (spans.numel + kQuantBlockElems - 1) / kQuantBlockElems;
  const std::size_t chunk_blocks = std::max<std::size_t>(1, options.chunk_elems / kQuantBlockElems);
  detail::for_each_chunk(arena, blocks, chunk_blocks,
                         [&](std::size_t begin, std::size_t end) { update(args, begin, end); });
}

double compressed_bytes_per_element(Algorithm algorithm, StateDType master_dtype,
                                    StateDType moment_dtype, DType grad_dtype,
                                    std::optional<DType> param_out_dtype, bool compensated) {
  constexpr double kBlock = static_cast<double>(kQuantBlockElems);
  const double moment = static_cast<double>(state_bytes(moment_dtype, kQuantBlockElems)) / kBlock;
  const double master = static_cast<double>(state_bytes(master_dtype, kQuantBlockElems)) / kBlock +
                        (compensated ? 2.0 : 0.0);
  const double moments = (detail::uses_exp_avg(algorithm) ? moment : 0.0) +
                         (detail::uses_exp_avg_sq(algorithm) ? moment : 0.0);
  return 2 * (master + moments) + static_cast<double>(dtype_bytes(grad_dtype)) +
         (param_out_dtype ? static_cast<double>(dtype_bytes(*param_out_dtype)) : 0.0);
}

}  // namespace strata::cpu_adam

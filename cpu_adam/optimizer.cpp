#include "cpu_adam/optimizer.hpp"

#include <cmath>
#include <sstream>
#include <stdexcept>

#include "base/assert.hpp"
#include "cpu_adam/detail/kernel_table.hpp"
#include "cpu_adam/detail/parallel.hpp"
#include "cpu_adam/detail/update_setup.hpp"

namespace strata::cpu_adam {
namespace detail {

UpdateRule rule_of(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kAdamW:
    case Algorithm::kAdam:
      return UpdateRule::kAdam;
    case Algorithm::kAdagrad:
      return UpdateRule::kAdagrad;
    case Algorithm::kLion:
      return UpdateRule::kLion;
  }
  return UpdateRule::kAdam;
}

bool uses_exp_avg(Algorithm algorithm) {
  return rule_uses_exp_avg(rule_of(algorithm));
}
bool uses_exp_avg_sq(Algorithm algorithm) {
  return rule_uses_exp_avg_sq(rule_of(algorithm));
}

int out_index(const TypedSpan& param_out) {
  if (!param_out.present()) return kOutNone;
  STRATA_ASSERT(param_out.dtype != DType::kFp32, "param_out must be bf16 or fp16");
  return param_out.dtype == DType::kBf16 ? kOutBf16 : kOutFp16;
}

// Everything per step is computed here in double and rounded to fp32 once.
UpdateConstants make_constants(const Hyperparams& h, const GradScaling& scaling) {
  UpdateConstants c;
  c.grad_multiplier = static_cast<float>(scaling.clip_coef / scaling.loss_scale);
  c.beta1 = static_cast<float>(h.beta1);
  c.one_minus_beta1 = static_cast<float>(1.0 - h.beta1);
  c.beta2 = static_cast<float>(h.beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
  c.eps = static_cast<float>(h.eps);
  c.step_size = static_cast<float>(h.lr);
  switch (h.algorithm) {
    case Algorithm::kAdamW:
    case Algorithm::kAdam: {
      if (h.bias_correction == BiasCorrection::kOn) {
        const double t = static_cast<double>(h.step);
        c.step_size = static_cast<float>(h.lr / (1.0 - std::pow(h.beta1, t)));
        c.inv_sqrt_bias_correction2 =
            static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(h.beta2, t)));
      }
      break;
    }
    case Algorithm::kAdagrad:
    case Algorithm::kLion:
      break;
  }
  const bool decoupled = h.algorithm == Algorithm::kAdamW || h.algorithm == Algorithm::kLion;
  c.use_decay = decoupled && h.weight_decay != 0.0;
  c.decay = static_cast<float>(1.0 - h.lr * h.weight_decay);
  c.use_l2 = !decoupled && h.weight_decay != 0.0;
  c.l2 = static_cast<float>(h.weight_decay);
  return c;
}

}  // namespace detail

namespace {

using detail::uses_exp_avg;
using detail::uses_exp_avg_sq;
using detail::rule_of;
using detail::out_index;
using detail::make_constants;


[[noreturn]] void fail(const char* what, double value) {
  std::ostringstream message;
  message << "cpu_adam: " << what << ", got " << value;
  throw std::invalid_argument(message.str());
}

detail::UpdateArgs make_args(const ParamSpans& spans) {
  detail::UpdateArgs args;
  args.master = spans.master.data();
  args.exp_avg = spans.exp_avg.data();
  args.exp_avg_sq = spans.exp_avg_sq.data();
  args.grad = spans.grad.data;
  args.param_out = spans.param_out.data;
  return args;
}

void check_spans(Algorithm algorithm, const ParamSpans& spans) {
  const std::size_t count = spans.master.size();
  STRATA_ASSERT(spans.grad.count == count, "grad length differs from master");
  STRATA_ASSERT(!uses_exp_avg(algorithm) || spans.exp_avg.size() == count,
                "exp_avg length differs from master");
  STRATA_ASSERT(!uses_exp_avg_sq(algorithm) || spans.exp_avg_sq.size() == count,
                "exp_avg_sq length differs from master");
  STRATA_ASSERT(!spans.param_out.present() || spans.param_out.count == count,
                "param_out length differs from master");
  STRATA_ASSERT(count == 0 || spans.grad.present(), "grad missing");
}

}  // namespace

void validate(const Hyperparams& h, const GradScaling& scaling) {
  // Messages are only built on failure: step() calls this on the hot path.
  if (!(std::isfinite(h.lr) && h.lr >= 0)) fail("lr must be finite and >= 0", h.lr);
  if (!(h.beta1 >= 0 && h.beta1 < 1)) fail("beta1 must be in [0, 1)", h.beta1);
  if (!(h.beta2 >= 0 && h.beta2 < 1)) fail("beta2 must be in [0, 1)", h.beta2);
  if (!(std::isfinite(h.eps) && h.eps >= 0)) fail("eps must be finite and >= 0", h.eps);
  if (!(std::isfinite(h.weight_decay) && h.weight_decay >= 0)) {
    fail("weight_decay must be finite and >= 0", h.weight_decay);
  }
  if (h.step < 1) fail("step must be >= 1 (1-based)", static_cast<double>(h.step));
  if (!(std::isfinite(scaling.loss_scale) && scaling.loss_scale > 0)) {
    fail("loss_scale must be finite and > 0", scaling.loss_scale);
  }
  if (!(std::isfinite(scaling.clip_coef) && scaling.clip_coef >= 0)) {
    fail("clip_coef must be finite and >= 0", scaling.clip_coef);
  }
}

void step(const Hyperparams& hyperparams, const ParamSpans& spans, const GradScaling& scaling,
          tbb::task_arena& arena, const ExecOptions& options) {
  validate(hyperparams, scaling);
  check_spans(hyperparams.algorithm, spans);
  const detail::KernelTable& kernels = detail::kernels_for(options);
  const detail::UpdateFn update =
      kernels.update[static_cast<int>(rule_of(hyperparams.algorithm))]
                    [static_cast<int>(spans.grad.dtype)][out_index(spans.param_out)];
  detail::UpdateArgs args = make_args(spans);
  args.constants = make_constants(hyperparams, scaling);
  detail::for_each_chunk(arena, spans.master.size(), options.chunk_elems,
                         [&](std::size_t begin, std::size_t end) { update(args, begin, end); });
}

void stream_bound(const ParamSpans& spans, tbb::task_arena& arena, const ExecOptions& options) {
  check_spans(Algorithm::kAdamW, spans);
  const detail::StreamFn stream =
      detail::kernels_for(options)
          .stream[static_cast<int>(spans.grad.dtype)][out_index(spans.param_out)];
  const detail::UpdateArgs args = make_args(spans);
  detail::for_each_chunk(arena, spans.master.size(), options.chunk_elems,
                         [&](std::size_t begin, std::size_t end) { stream(args, begin, end); });
}

std::size_t bytes_per_element(Algorithm algorithm, DType grad_dtype,
                              std::optional<DType> param_out_dtype) {
  const std::size_t state_arrays = 1 + std::size_t{uses_exp_avg(algorithm)} +
                                   std::size_t{uses_exp_avg_sq(algorithm)};  // master + moments
  return state_arrays * 2 * sizeof(float) + dtype_bytes(grad_dtype) +
         (param_out_dtype ? dtype_bytes(*param_out_dtype) : 0);
}

}  // namespace strata::cpu_adam

#include "runtime/cli/bench_device_optimizer.hpp"

#include <chrono>

#include "cpu_adam/compressed_step.hpp"
#include "cpu_adam/optimizer.hpp"

namespace strata::cli {

std::uint64_t device_optimizer_bytes(std::uint64_t params) {
  // fp32 master, exp_avg, exp_avg_sq; bf16 grads and params; the norm's scratch and its sum.
  return params * (3 * 4 + 2 + 2) + tiers::sum_of_squares_scratch_bytes(params) + 4096;
}

DeviceOptimizerFigures measure_device_optimizer(tiers::Device& device, std::uint64_t params,
                                                int iterations) {
  tiers::Stream stream = device.create_stream();
  tiers::DeviceBuffer master = device.allocate(params * 4);
  tiers::DeviceBuffer exp_avg = device.allocate(params * 4);
  tiers::DeviceBuffer exp_avg_sq = device.allocate(params * 4);
  tiers::DeviceBuffer grad = device.allocate(params * 2);
  tiers::DeviceBuffer param_out = device.allocate(params * 2);
  tiers::DeviceBuffer sum = device.allocate(sizeof(double));
  tiers::DeviceBuffer scratch = device.allocate(tiers::sum_of_squares_scratch_bytes(params));
  // Ordinary values, so no iteration takes a denormal or special-case path: weights 0.5, moments
  // 0, gradients 0x3c3c (bf16 0.0115).
  stream.fill(master.span(), 0.5f);
  stream.fill(exp_avg.span(), 0.0f);
  stream.fill(exp_avg_sq.span(), 0.0f);
  stream.fill_bytes(grad.span(), 0x3c);
  stream.fill_bytes(sum.span(), 0);
  stream.synchronize();

  cpu_adam::Hyperparams hyper;
  hyper.algorithm = cpu_adam::Algorithm::kAdamW;
  hyper.weight_decay = 0.01;
  tiers::OptimizerOp op;
  op.plan = cpu_adam::plan_step(hyper, {}, {});
  op.numel = params;
  op.master = master.data();
  op.exp_avg = exp_avg.data();
  op.exp_avg_sq = exp_avg_sq.data();
  op.grad = grad.data();
  op.grad_dtype = DType::kBf16;
  op.param_out = param_out.data();
  op.param_out_dtype = DType::kBf16;

  DeviceOptimizerFigures figures;
  figures.params = params;
  const double n = static_cast<double>(params);
  figures.update_bytes = n * static_cast<double>(cpu_adam::bytes_per_element(
                                 cpu_adam::Algorithm::kAdamW, DType::kBf16, DType::kBf16));
  figures.update_s = seconds_per_iteration(iterations, [&] {
    stream.optimizer_update(op);
    stream.synchronize();
  });
  figures.sum_of_squares_bytes = n * 2;
  figures.sum_of_squares_s = seconds_per_iteration(iterations, [&] {
    stream.sum_of_squares(grad.span(), DType::kBf16, sum.span(), scratch.span());
    stream.synchronize();
  });
  return figures;
}

}  // namespace strata::cli

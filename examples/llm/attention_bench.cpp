// strata-attention-bench: forward and backward time of the decoder's CUDA attention kernels on one
// shape, the tensor-core flash attention (flash_attention.hpp; bf16 inputs, and fp32 inputs
// rounded into its scratch as the decoder calls it) next to the fp32 tiled reference
// (decoder_cuda_kernels.hpp). CUDA events around each launch sequence, warm-up runs first, the
// median of the timed ones; achieved TFLOPS from the attention's FLOPs: forward 4·B·H·D per
// visible (query, key) pair (QKᵀ and PV; causal: 2·2·B·H·S²·D / 2), backward 2.5x that.
// Default: the 1.08 B Llama's attention (8 × 1024 positions, 16 heads over 4 kv heads, 128).
//
//   strata-attention-bench [--sequences 8] [--positions 1024] [--heads 16] [--kv-heads 4]
//                          [--head-dim 128] [--window 0] [--iterations 20] [--warmup 3]
//
// One line per (pass, kernel), for scripts:
//   attention-bench: forward  flash_bf16   ms 1.234  TFLOPS 222.8
// then the flash outputs' relative errors against the reference (a sanity check, not a test).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <functional>
#include <iostream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "examples/llm/cuda_event_timer.hpp"
#include "models/decoder/cuda_device_array.hpp"
#include "models/decoder/decoder_cuda_kernels.hpp"
#include "models/decoder/flash_attention.hpp"

namespace {

namespace cuda = strata::llm::cuda;

using cuda::DeviceArray;
void check(cudaError_t result, const char* call) {
  cuda::check_cuda(result, call);
}

struct Options {
  std::size_t sequences = 8, positions = 1024, heads = 16, kv_heads = 4, head_dim = 128;
  std::size_t window = 0;
  int iterations = 20, warmup = 3;
};

// Visible (query, key) pairs of one (sequence, head): S²/2 for causal attention (the usual
// convention), the exact count under a window.
double visible_pairs(const Options& o) {
  const auto s = static_cast<double>(o.positions);
  if (o.window == 0 || o.window >= o.positions) return s * s / 2;
  double pairs = 0;
  for (std::size_t i = 0; i < o.positions; ++i) {
    pairs += static_cast<double>(std::min(i + 1, o.window));
  }
  return pairs;
}

double relative_error(const std::vector<float>& a, const std::vector<float>& b, std::size_t ld,
                      std::size_t first, std::size_t width) {
  double diff = 0, norm = 0;
  for (std::size_t r = 0; r < a.size() / ld; ++r) {
    for (std::size_t c = first; c < first + width; ++c) {
      const double x = a[r * ld + c], y = b[r * ld + c];
      diff += (x - y) * (x - y);
      norm += y * y;
    }
  }
  return std::sqrt(diff / norm);
}

// One benchmark shape on the device and the six launches under test. q | k | v are the decoder's
// fused rows (ld floats apart), filled with seeded normal noise like the output gradient; the bf16
// kernels read bf16 copies of both. The fp32 launches write out / lse / delta / dqkv, the bf16
// backward reads out16, which the caller fills with round_out_to_bf16().
struct AttentionProblem {
  explicit AttentionProblem(const Options& o);

  void forward_fp32() const {
    check(cuda::attention_forward(dims, q, k, v, ld, out.get(), q_width, lse.get(), nullptr),
          "attention_forward");
  }
  void forward_flash() const {
    check(cuda::flash_attention_forward(dims, q, k, v, ld, out.get(), q_width, lse.get(),
                                        scratch.get(), nullptr),
          "flash_attention_forward");
  }
  void forward_flash_bf16() const {
    check(cuda::flash_attention_forward(dims, q16, k16, v16, {out.get(), q_width}, lse.get(),
                                        nullptr),
          "flash_attention_forward (bf16)");
  }
  void backward_fp32() const {
    check(cuda::attention_backward(dims, dout.get(), q_width, out.get(), q, k, v, ld, lse.get(),
                                   delta.get(), dq, dk, dv, nullptr),
          "attention_backward");
  }
  void backward_flash() const {
    check(
        cuda::flash_attention_backward(dims, dout.get(), q_width, out.get(), q, k, v, ld, lse.get(),
                                       delta.get(), dq, dk, dv, scratch.get(), nullptr),
        "flash_attention_backward");
  }
  void backward_flash_bf16() const {
    check(cuda::flash_attention_backward(dims, {dout16.get(), q_width}, {out16.get(), q_width}, q16,
                                         k16, v16, lse.get(), delta.get(), {dq, ld}, {dk, ld},
                                         {dv, ld}, nullptr),
          "flash_attention_backward (bf16)");
  }
  void round_out_to_bf16() const {
    check(cuda::cast_to_bf16(out.get(), q_width, out16.get(), q_width, rows, q_width, nullptr),
          "cast_to_bf16");
  }

  const std::size_t rows, q_width, kv_width;
  const std::size_t ld;  // the decoder's fused q | k | v rows
  DeviceArray<float> qkv, dout, out, lse, delta, dqkv;
  DeviceArray<std::uint32_t> first_key;
  const cuda::AttentionDims dims;
  DeviceArray<__nv_bfloat16> scratch, qkv16, dout16, out16;
  // Views into the fused rows: q | k | v of qkv and qkv16, dq | dk | dv of dqkv.
  const float *q, *k, *v;
  float *dq, *dk, *dv;
  const cuda::Bf16Rows q16, k16, v16;
};

AttentionProblem::AttentionProblem(const Options& o)
    : rows(o.sequences * o.positions),
      q_width(o.heads * o.head_dim),
      kv_width(o.kv_heads * o.head_dim),
      ld(q_width + 2 * kv_width),
      qkv(rows * ld),
      dout(rows * q_width),
      out(rows * q_width),
      lse(o.sequences * o.heads * o.positions),
      delta(o.sequences * o.heads * o.positions),
      dqkv(rows * ld),
      first_key(rows),
      dims{o.sequences, o.positions, o.heads, o.kv_heads, o.head_dim, o.window, first_key.get()},
      scratch(cuda::flash_attention_scratch_elements(dims)),
      qkv16(rows * ld),
      dout16(rows * q_width),
      out16(rows * q_width),
      q(qkv.get()),
      k(q + q_width),
      v(k + kv_width),
      dq(dqkv.get()),
      dk(dq + q_width),
      dv(dk + kv_width),
      q16{qkv16.get(), ld},
      k16{qkv16.get() + q_width, ld},
      v16{qkv16.get() + q_width + kv_width, ld} {
  std::vector<float> host_qkv(rows * ld), host_dout(rows * q_width);
  std::mt19937_64 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : host_qkv) x = normal(rng);
  for (float& x : host_dout) x = normal(rng);
  qkv.upload(host_qkv);
  dout.upload(host_dout);
  first_key.upload(std::vector<std::uint32_t>(rows, 0));  // one document per sequence
  check(cuda::cast_to_bf16(qkv.get(), ld, qkv16.get(), ld, rows, ld, nullptr), "cast_to_bf16");
  check(cuda::cast_to_bf16(dout.get(), q_width, dout16.get(), q_width, rows, q_width, nullptr),
        "cast_to_bf16");
}

// The current device's properties, once it is known to run the tensor-core attention at
// o.head_dim.
cudaDeviceProp checked_device(const Options& o) {
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  if (!cuda::flash_attention_supported(o.head_dim, device)) {
    throw std::runtime_error("the tensor-core attention does not take head_dim " +
                             std::to_string(o.head_dim) + " on this GPU");
  }
  return prop;
}

int run(const Options& o) {
  const cudaDeviceProp prop = checked_device(o);
  const AttentionProblem p(o);
  const std::size_t q_width = p.q_width, kv_width = p.kv_width, ld = p.ld;

  const double forward_flops =
      4.0 * static_cast<double>(o.sequences * o.heads * o.head_dim) * visible_pairs(o);
  const double backward_flops = 2.5 * forward_flops;
  fmt::print(
      "attention-bench: {} (sm_{}{}), {} x {} positions, {} heads / {} kv, head_dim {}, {}, "
      "median of {} after {} warm-up; forward {:.3g} GFLOP, backward {:.3g} GFLOP\n",
      prop.name, prop.major, prop.minor, o.sequences, o.positions, o.heads, o.kv_heads, o.head_dim,
      o.window == 0 ? std::string("causal") : fmt::format("window {}", o.window), o.iterations,
      o.warmup, forward_flops / 1e9, backward_flops / 1e9);
  strata::examples::EventTimer timer;
  const auto report = [&](const char* pass, const char* kernel, double flops,
                          const std::function<void()>& launch) {
    const double ms = timer.median_ms(launch, o.warmup, o.iterations);
    fmt::print("attention-bench: {:8} {:12} ms {:8.3f}  TFLOPS {:7.1f}\n", pass, kernel, ms,
               flops / (ms * 1e-3) / 1e12);
    return ms;
  };
  const double fp32_forward =
      report("forward", "fp32_tiled", forward_flops, [&] { p.forward_fp32(); });
  const std::vector<float> reference_out = p.out.download();
  const double flash_forward =
      report("forward", "flash_fp32io", forward_flops, [&] { p.forward_flash(); });
  report("forward", "flash_bf16", forward_flops, [&] { p.forward_flash_bf16(); });
  p.round_out_to_bf16();
  const std::vector<float> flash_out = p.out.download();

  p.forward_fp32();  // the reference's lse for its backward
  const double fp32_backward =
      report("backward", "fp32_tiled", backward_flops, [&] { p.backward_fp32(); });
  const std::vector<float> reference_grads = p.dqkv.download();
  p.forward_flash();
  const double flash_backward =
      report("backward", "flash_fp32io", backward_flops, [&] { p.backward_flash(); });
  const std::vector<float> flash_grads = p.dqkv.download();
  report("backward", "flash_bf16", backward_flops, [&] { p.backward_flash_bf16(); });

  fmt::print(
      "attention-bench: speedup flash_fp32io over fp32_tiled: forward {:.1f}x, backward "
      "{:.1f}x\n",
      fp32_forward / flash_forward, fp32_backward / flash_backward);
  fmt::print(
      "attention-bench: flash vs fp32 relative error: out {:.2e}, dq {:.2e}, dk {:.2e}, "
      "dv {:.2e}\n",
      relative_error(flash_out, reference_out, q_width, 0, q_width),
      relative_error(flash_grads, reference_grads, ld, 0, q_width),
      relative_error(flash_grads, reference_grads, ld, q_width, kv_width),
      relative_error(flash_grads, reference_grads, ld, q_width + kv_width, kv_width));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Forward and backward time of the CUDA attention kernels (tensor cores vs fp32)"};
  Options o;
  app.add_option("--sequences", o.sequences, "sequences (micro-batch)")->check(CLI::PositiveNumber);
  app.add_option("--positions", o.positions, "positions per sequence")->check(CLI::PositiveNumber);
  app.add_option("--heads", o.heads, "query heads")->check(CLI::PositiveNumber);
  app.add_option("--kv-heads", o.kv_heads, "kv heads (divides --heads)")
      ->check(CLI::PositiveNumber);
  app.add_option("--head-dim", o.head_dim, "head dimension")->check(CLI::PositiveNumber);
  app.add_option("--window", o.window, "sliding window (0: full causal)");
  app.add_option("--iterations", o.iterations, "timed runs per kernel")->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup, "untimed runs first");
  CLI11_PARSE(app, argc, argv);
  if (o.heads % o.kv_heads != 0) {
    std::cerr << "strata-attention-bench: --kv-heads must divide --heads\n";
    return 2;
  }
  try {
    return run(o);
  } catch (const std::exception& error) {
    std::cerr << "strata-attention-bench: error: " << error.what() << "\n";
    return 1;
  }
}

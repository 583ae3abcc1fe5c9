// strata-kernel-bench: the bf16 CUDA decoder's element-wise, norm and loss kernels
// (fused_kernels.hpp) one by one on a Llama layer's shapes, next to a device-to-device copy of
// the same run: the bound they chase. Each kernel's bytes are what its call must read and write
// once (activations, weights and outputs; the small per-row statistics and tables included);
// GB/s = bytes / median time; of-copy = that over the copy's GB/s (the copy moves 2 x its size:
// read and written). CUDA events around each launch, warm-up runs first, the median of the rest.
// Default: the 1.08 B Llama (hidden 2048, 24 layers, 16 / 4 heads of 128, inner 5632) at seq 1024
// x micro-batch 8 = 8192 rows; the loss on one chunk of rows as the decoder sizes it (256 MiB of
// fp32 logits: 2048 rows of a 32000 vocabulary, 512 of 128256).
//
//   strata-kernel-bench [--rows 8192] [--hidden 2048] [--inner 5632] [--heads 16] [--kv-heads 4]
//                       [--head-dim 128] [--seq 1024] [--layers 24] [--vocab 32000 --vocab 128256]
//                       [--iterations 20] [--warmup 3] [--copy-mib 256]
//
// One line per kernel, and per vocabulary a step estimate (each kernel's time x its calls in one
// training step without activation checkpointing, the LM head's included), for scripts:
//   kernel-bench: norm_forward ms 0.031 MB 100.7 GB/s 3248.1 of-copy 0.852
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
#include <string>
#include <vector>

#include "examples/llm/cuda_event_timer.hpp"
#include "models/decoder/cuda_device_array.hpp"
#include "models/decoder/decoder_cuda_kernels.hpp"
#include "models/decoder/fused_kernels.hpp"

namespace {

namespace cuda = strata::llm::cuda;
using bf16 = __nv_bfloat16;
using cuda::DeviceArray;
void check(cudaError_t result, const char* call) {
  cuda::check_cuda(result, call);
}

struct Options {
  std::size_t rows = 8192, hidden = 2048, inner = 5632, heads = 16, kv_heads = 4, head_dim = 128;
  std::size_t seq = 1024, layers = 24;
  std::vector<std::size_t> vocabs = {32000, 128256};
  int iterations = 20, warmup = 3;
  std::size_t copy_mib = 256;
};

// decoder_cuda_plan.cpp's cuda_loss_chunk_rows: 256 MiB of fp32 logits, whole 64-row tiles.
std::size_t loss_chunk_rows(std::size_t vocab, std::size_t rows) {
  std::size_t chunk = std::max<std::size_t>(1, (std::size_t{1} << 26) / vocab);
  if (chunk >= 64) chunk -= chunk % 64;
  return std::min(chunk, rows);
}

// Seeded uniform values in [-scale, scale]: a 1 Mi-element pattern, repeated.
template <typename T>
void fill(T* device, std::size_t count, std::uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-scale, scale);
  std::vector<T> pattern(std::min<std::size_t>(count, std::size_t{1} << 20));
  for (T& v : pattern) v = static_cast<T>(uniform(rng));
  for (std::size_t at = 0; at < count; at += pattern.size()) {
    const std::size_t n = std::min(pattern.size(), count - at);
    check(cudaMemcpy(device + at, pattern.data(), n * sizeof(T), cudaMemcpyHostToDevice),
          "cudaMemcpy");
  }
}
// One layer's activations and gradients at the bench's shape, as decoder_cuda_bf16.cpp holds them.
struct Layer {
  explicit Layer(const Options& o);

  std::size_t rows, d, inner, q_width, qkv_width, rotated_heads, half, weights;
  DeviceArray<float> x, dy, dx, norm_weight, mean, rstd, dweight;
  DeviceArray<bf16> y, dx16;
  DeviceArray<bf16> qkv;
  DeviceArray<float> dqkv;
  DeviceArray<bf16> dqkv16;
  DeviceArray<float> cos, sin;
  DeviceArray<std::uint32_t> row_positions;
  DeviceArray<bf16> pre, act, dact, dpre;
  DeviceArray<float> weights32;
  DeviceArray<bf16> weights16;
};

Layer::Layer(const Options& o)
    : rows(o.rows),
      d(o.hidden),
      inner(o.inner),
      q_width(o.heads * o.head_dim),
      qkv_width(q_width + 2 * o.kv_heads * o.head_dim),
      rotated_heads(o.heads + o.kv_heads),
      half(o.head_dim / 2),
      weights(d * (qkv_width + q_width + 2 * inner + inner)),
      x(rows * d),
      dy(rows * d),
      dx(rows * d),
      norm_weight(d),
      mean(rows),
      rstd(rows),
      dweight(d),
      y(rows * d),
      dx16(rows * d),
      qkv(rows * qkv_width),
      dqkv(rows * qkv_width),
      dqkv16(rows * qkv_width),
      cos(o.seq * half),
      sin(o.seq * half),
      row_positions(rows),
      pre(rows * 2 * inner),
      act(rows * inner),
      dact(rows * inner),
      dpre(rows * 2 * inner),
      weights32(weights),
      weights16(weights) {
  fill(x.get(), rows * d, 1, 2.0f);
  fill(dy.get(), rows * d, 2);
  fill(dx.get(), rows * d, 3);
  fill(norm_weight.get(), d, 4);
  fill(mean.get(), rows, 5);
  fill(rstd.get(), rows, 6);
  fill(qkv.get(), rows * qkv_width, 7);
  fill(dqkv.get(), rows * qkv_width, 8);
  fill(pre.get(), rows * 2 * inner, 9, 3.0f);
  fill(dact.get(), rows * inner, 10);
  fill(weights32.get(), weights, 11, 0.05f);
  std::vector<float> c(o.seq * half), s(o.seq * half);
  for (std::size_t p = 0; p < o.seq; ++p) {
    for (std::size_t i = 0; i < half; ++i) {
      const double angle =
          static_cast<double>(p) * std::pow(10000.0, -static_cast<double>(i) / half);
      c[p * half + i] = static_cast<float>(std::cos(angle));
      s[p * half + i] = static_cast<float>(std::sin(angle));
    }
  }
  cos.upload(c);
  sin.upload(s);
  std::vector<std::uint32_t> positions(rows);
  for (std::size_t r = 0; r < rows; ++r) positions[r] = static_cast<std::uint32_t>(r % o.seq);
  row_positions.upload(positions);
}

// One chunk of the LM head's loss at one vocabulary, and the head's weights.
struct LossChunk {
  LossChunk(std::size_t vocab_, std::size_t rows_, std::size_t hidden)
      : vocab(vocab_),
        rows(rows_),
        logits(rows * vocab),
        dlogits(rows * vocab),
        targets(rows),
        weights(rows),
        lse(rows),
        row_loss(rows),
        head32(vocab * hidden),
        head16(vocab * hidden) {
    fill(logits.get(), rows * vocab, 12, 6.0f);
    fill(head32.get(), vocab * hidden, 13, 0.05f);
    std::vector<std::int32_t> t(rows);
    for (std::size_t r = 0; r < rows; ++r) t[r] = static_cast<std::int32_t>((r * 7919) % vocab);
    targets.upload(t);
    weights.upload(std::vector<float>(rows, 1.0f));
  }
  std::size_t vocab, rows;
  DeviceArray<float> logits;
  DeviceArray<bf16> dlogits;
  DeviceArray<std::int32_t> targets;
  DeviceArray<float> weights, lse;
  DeviceArray<double> row_loss;
  DeviceArray<float> head32;
  DeviceArray<bf16> head16;
};

struct Figure {
  std::string name;
  double ms, bytes;
  double calls_per_step;  // in one training step of the model (0: not part of one)
};

class Bench {
 public:
  Bench(const Options& o, double copy_gbps) : o_(o), copy_gbps_(copy_gbps) {}

  void time(const std::string& name, double bytes, double calls_per_step,
            const std::function<void()>& launch) {
    const double ms = timer_.median_ms(launch, o_.warmup, o_.iterations);
    check(cudaGetLastError(), name.c_str());
    print(name, ms, bytes);
    figures_.push_back({name, ms, bytes, calls_per_step});
  }
  void print(const std::string& name, double ms, double bytes) const {
    const double gbps = bytes / (ms * 1e-3) / 1e9;
    fmt::print("kernel-bench: {:32} ms {:8.3f} MB {:9.1f} GB/s {:7.1f} of-copy {:.3f}\n", name, ms,
               bytes / 1e6, gbps, gbps / copy_gbps_);
  }
  // Each kernel's time x its calls per step, from the figures so far plus `extra` (the head's).
  void step_estimate(const std::string& name, const std::vector<Figure>& extra) const {
    double ms = 0, bytes = 0;
    for (const std::vector<Figure>* list : {&figures_, &extra}) {
      for (const Figure& f : *list) {
        ms += f.ms * f.calls_per_step;
        bytes += f.bytes * f.calls_per_step;
      }
    }
    print(name, ms, bytes);
  }
  std::vector<Figure> take_figures_since(std::size_t first) {
    std::vector<Figure> taken(figures_.begin() + static_cast<std::ptrdiff_t>(first),
                              figures_.end());
    figures_.resize(first);
    return taken;
  }
  std::size_t figure_count() const { return figures_.size(); }

 private:
  const Options& o_;
  double copy_gbps_;
  strata::examples::EventTimer timer_;
  std::vector<Figure> figures_;
};

// GB/s of a device-to-device cudaMemcpy of copy_mib MiB (2 x its size moved).
double measure_copy(const Options& o) {
  const std::size_t bytes = o.copy_mib << 20;
  DeviceArray<std::byte> src(bytes), dst(bytes);
  check(cudaMemset(src.get(), 1, bytes), "cudaMemset");
  strata::examples::EventTimer timer;
  const double ms = timer.median_ms(
      [&] {
        check(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, nullptr),
              "cudaMemcpyAsync");
      },
      o.warmup, o.iterations);
  return 2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
}

void bench_layer(Bench& bench, const Options& o) {
  Layer l(o);
  const double rd = static_cast<double>(l.rows * l.d);
  const double layers = static_cast<double>(o.layers);
  const double rows = static_cast<double>(l.rows);
  const auto act = cuda::ActivationCode::kSilu;
  // fp32 weights read, bf16 written; forward and backward each cast the layer once.
  bench.time("cast_weights", 6.0 * static_cast<double>(l.weights), 2 * layers, [&] {
    check(cuda::round_to_bf16(l.weights32.get(), l.weights16.get(), l.weights, nullptr),
          "round_to_bf16");
  });
  // x fp32 in, y bf16 out, the weight, mean and rstd: norm1, norm2 per layer and the head's.
  bench.time("norm_forward", 6.0 * rd + 4.0 * l.d + 8.0 * rows, 2 * layers + 1, [&] {
    check(cuda::norm_forward_bf16(l.x.get(), l.norm_weight.get(), nullptr, l.y.get(), l.mean.get(),
                                  l.rstd.get(), l.rows, l.d, 1e-5f, nullptr),
          "norm_forward_bf16");
  });
  // Row pass: dy, x in, dx read and written, dx bf16 out (18 B); the weight gradient's column
  // sums read dy and x again (8 B).
  bench.time("norm_backward", 26.0 * rd + 8.0 * l.d + 4.0 * rows, 2 * layers + 1, [&] {
    check(cuda::norm_backward_bf16(l.dy.get(), l.x.get(), nullptr, l.rstd.get(),
                                   l.norm_weight.get(), l.dx.get(), l.dx16.get(), l.dweight.get(),
                                   nullptr, l.rows, l.d, cuda::DxUpdate::kAccumulate, nullptr),
          "norm_backward_bf16");
  });
  // What the bf16 path ran before: the fp32 path's norm backward, then a cast of d_resid (its
  // passes' bytes: 16 + 8 + 6 per element). Not part of a step any more.
  bench.time("norm_backward_unfused_before", 30.0 * rd, 0, [&] {
    check(cuda::rms_norm_backward(l.dy.get(), l.x.get(), l.rstd.get(), l.norm_weight.get(),
                                  l.dx.get(), l.dweight.get(), l.rows, l.d, nullptr),
          "rms_norm_backward");
    check(cuda::cast_to_bf16(l.dx.get(), l.d, l.dx16.get(), l.d, l.rows, l.d, nullptr),
          "cast_to_bf16");
  });
  const double rotated = static_cast<double>(l.rows * l.rotated_heads * 2 * l.half);
  bench.time("rope_forward", 4.0 * rotated, layers, [&] {
    check(cuda::rope_forward_bf16(l.qkv.get(), l.qkv_width, l.rows, l.rotated_heads, l.half,
                                  l.row_positions.get(), l.cos.get(), l.sin.get(), nullptr),
          "rope_forward_bf16");
  });
  // fp32 d(q | k | v) in, its rotated part written back, all of it rounded out.
  const double qkv = static_cast<double>(l.rows * l.qkv_width);
  bench.time("rope_backward", 4.0 * qkv + 4.0 * rotated + 2.0 * qkv, layers, [&] {
    check(cuda::rope_backward_to_bf16(l.dqkv.get(), l.dqkv16.get(), l.qkv_width, l.rows,
                                      l.qkv_width, l.rotated_heads, l.half, l.row_positions.get(),
                                      l.cos.get(), l.sin.get(), nullptr),
          "rope_backward_to_bf16");
  });
  const double ri = static_cast<double>(l.rows * l.inner);
  bench.time("gated_forward", 6.0 * ri, layers, [&] {
    check(cuda::gated_forward_bf16(act, l.pre.get(), l.act.get(), l.rows, l.inner, nullptr),
          "gated_forward_bf16");
  });
  bench.time("gated_backward", 10.0 * ri, layers, [&] {
    check(cuda::gated_backward_bf16(act, l.dact.get(), l.pre.get(), l.dpre.get(), l.rows, l.inner,
                                    nullptr),
          "gated_backward_bf16");
  });
}

// The head at one vocabulary: its weight cast (forward and backward) and the loss's chunks.
std::vector<Figure> bench_head(Bench& bench, const Options& o, std::size_t vocab) {
  const std::size_t chunk_rows = loss_chunk_rows(vocab, o.rows);
  const double chunks = std::ceil(static_cast<double>(o.rows) / static_cast<double>(chunk_rows));
  LossChunk c(vocab, chunk_rows, o.hidden);
  const std::size_t first = bench.figure_count();
  const double logits = static_cast<double>(chunk_rows * vocab);
  const std::string suffix = fmt::format("_v{}", vocab);
  bench.time("cast_head" + suffix, 6.0 * static_cast<double>(vocab * o.hidden), 2, [&] {
    check(cuda::round_to_bf16(c.head32.get(), c.head16.get(), vocab * o.hidden, nullptr),
          "round_to_bf16");
  });
  bench.time(
      fmt::format("cross_entropy_forward{}_r{}", suffix, chunk_rows), 4.0 * logits, chunks, [&] {
        check(
            cuda::cross_entropy_forward(c.logits.get(), c.targets.get(), c.weights.get(),
                                        c.lse.get(), c.row_loss.get(), chunk_rows, vocab, nullptr),
            "cross_entropy_forward");
      });
  bench.time(fmt::format("cross_entropy_backward{}_r{}", suffix, chunk_rows), 6.0 * logits, chunks,
             [&] {
               check(cuda::cross_entropy_backward(c.logits.get(), c.lse.get(), c.targets.get(),
                                                  c.weights.get(), 1.0f / 8192, c.dlogits.get(),
                                                  chunk_rows, vocab, nullptr),
                     "cross_entropy_backward");
             });
  return bench.take_figures_since(first);
}

int run(const Options& o) {
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  const double copy_gbps = measure_copy(o);
  fmt::print(
      "kernel-bench: {} (sm_{}{}), {} rows, hidden {}, inner {}, {} / {} heads of {}, {} layers; "
      "median of {} after {} warm-up; device->device copy of {} MiB: {:.1f} GB/s\n",
      prop.name, prop.major, prop.minor, o.rows, o.hidden, o.inner, o.heads, o.kv_heads, o.head_dim,
      o.layers, o.iterations, o.warmup, o.copy_mib, copy_gbps);
  Bench bench(o, copy_gbps);
  bench.print("copy", 2.0 * static_cast<double>(o.copy_mib << 20) / copy_gbps / 1e6,
              2.0 * static_cast<double>(o.copy_mib << 20));
  bench_layer(bench, o);
  std::vector<std::vector<Figure>> heads;
  for (const std::size_t vocab : o.vocabs) heads.push_back(bench_head(bench, o, vocab));
  for (std::size_t i = 0; i < o.vocabs.size(); ++i) {
    bench.step_estimate(fmt::format("step_estimate_v{}", o.vocabs[i]), heads[i]);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Time and GB/s of the bf16 decoder's element-wise, norm and loss kernels"};
  Options o;
  app.add_option("--rows", o.rows, "rows (seq x micro-batch)")->check(CLI::PositiveNumber);
  app.add_option("--hidden", o.hidden, "hidden size")->check(CLI::PositiveNumber);
  app.add_option("--inner", o.inner, "MLP intermediate size")->check(CLI::PositiveNumber);
  app.add_option("--heads", o.heads, "query heads")->check(CLI::PositiveNumber);
  app.add_option("--kv-heads", o.kv_heads, "kv heads")->check(CLI::PositiveNumber);
  app.add_option("--head-dim", o.head_dim, "head dimension (even)")->check(CLI::PositiveNumber);
  app.add_option("--seq", o.seq, "positions per sequence (RoPE's table)")
      ->check(CLI::PositiveNumber);
  app.add_option("--layers", o.layers, "layers (the step estimate's calls)")
      ->check(CLI::PositiveNumber);
  app.add_option("--vocab", o.vocabs, "vocabularies of the loss (repeatable)");
  app.add_option("--iterations", o.iterations, "timed runs per kernel")->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup, "untimed runs first");
  app.add_option("--copy-mib", o.copy_mib, "MiB of the device->device copy")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  if (o.head_dim % 2 != 0) {
    std::cerr << "strata-kernel-bench: --head-dim must be even\n";
    return 2;
  }
  try {
    return run(o);
  } catch (const std::exception& error) {
    std::cerr << "strata-kernel-bench: error: " << error.what() << "\n";
    return 1;
  }
}

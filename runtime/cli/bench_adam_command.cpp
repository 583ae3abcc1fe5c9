// `strata bench adam`: the CPU optimizer against the memory bound of its own access pattern, and
// the fused full step (norm fed as gradients arrive + unscale + clip + AdamW + 16-bit copy-out)
// against the same work done as separate passes; with --state-dtype, the fused compressed step
// (step_compressed: decode, update, encode per block) on the same parameters, beside the fp32 one.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>
#include <nlohmann/json.hpp>

#include "base/units.hpp"
#include "cpu_adam/cast.hpp"
#include "cpu_adam/compressed_step.hpp"
#include "cpu_adam/grad_norm.hpp"
#include "cpu_adam/optimizer.hpp"
#include "cpu_adam/state_format.hpp"
#include "runtime/cli/commands.hpp"

namespace strata::cli {
namespace {

using cpu_adam::ConstTypedSpan;
using cpu_adam::TypedSpan;
using Clock = std::chrono::steady_clock;

struct BenchAdamOptions {
  std::string params = "1e8";
  int threads = 1;
  std::string grad_dtype = "fp32";
  std::string param_out = "none";
  std::string simd;  // empty: best available
  std::vector<std::string> state_dtypes;  // moment formats of the compressed rows; empty: none
  std::string master_dtype = "bf16";      // master format of the compressed rows
  std::string master_rounding = "stochastic";  // ... and, bf16, its rounding: or "kahan"
  int repeats = 5;
  bool json = false;
};

// A 64-byte aligned host array, first touched in parallel so its pages exist before timing.
class HostArray {
 public:
  HostArray(std::size_t bytes, tbb::task_arena& arena)
      : bytes_(round_up(std::max<std::size_t>(bytes, 1), kSimdAlignment)),
        data_(static_cast<unsigned char*>(std::aligned_alloc(kSimdAlignment, bytes_))) {
    if (data_ == nullptr) throw std::bad_alloc();
    arena.execute([&] {
      tbb::parallel_for(tbb::blocked_range<std::size_t>(0, bytes_, kMiB),
                        [&](const tbb::blocked_range<std::size_t>& range) {
                          std::memset(data_.get() + range.begin(), 0, range.size());
                        });
    });
  }
  template <class T>
  T* as() {
    return reinterpret_cast<T*>(data_.get());
  }

 private:
  struct Free {
    void operator()(unsigned char* p) const { std::free(p); }
  };
  std::size_t bytes_;
  std::unique_ptr<unsigned char, Free> data_;
};

// The 1-minute load average, printed with the figures: other processes share memory bandwidth.
double load_average() {
  double load = -1;
  if (std::FILE* file = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(file, "%lf", &load) != 1) load = -1;
    std::fclose(file);
  }
  return load;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct Figures {
  double bound_s = 0;
  double optimizer_s = 0;
  double fused_s = 0;
  double fused_norm_s = 0;  // the part of fused_s spent feeding the norm
  double separate_s = 0;
  double separate_pass_s[4] = {};  // norm, unscale, AdamW, cast
  std::size_t bytes_per_param = 0;
  std::size_t full_step_bytes_fused = 0;
  std::size_t full_step_bytes_separate = 0;
};

// One compressed row: AdamW by step_compressed() over its own copy of the state.
struct CompressedRow {
  cpu_adam::StateDType moment_dtype = cpu_adam::StateDType::kFp32;
  std::vector<std::byte> master, compensation, exp_avg, exp_avg_sq;  // compensation: kahan
  double seconds = 1e300;
  double bytes_per_param = 0;
};

int run_bench_adam(const BenchAdamOptions& options) {
  double params_value = 0;
  std::size_t used = 0;
  try {
    params_value = std::stod(options.params, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != options.params.size() || !(params_value >= 1) || params_value > 1e11) {
    std::cerr << "strata bench adam: --params: \"" << options.params
              << "\" is not a parameter count between 1 and 1e11 (e.g. 1e8)\n";
    return kExitBadInput;
  }
  const auto count = static_cast<std::size_t>(params_value);
  const std::optional<DType> grad_dtype = parse_floating_dtype(options.grad_dtype);
  if (!grad_dtype) {
    std::cerr << "strata bench adam: --grad-dtype must be fp32, bf16 or fp16\n";
    return kExitBadInput;
  }
  std::optional<DType> out_dtype;
  if (options.param_out != "none") {
    out_dtype = parse_floating_dtype(options.param_out);
    if (!out_dtype || *out_dtype == DType::kFp32) {
      std::cerr << "strata bench adam: --param-out must be none, bf16 or fp16\n";
      return kExitBadInput;
    }
  }
  cpu_adam::ExecOptions exec;
  if (!options.simd.empty()) {
    exec.simd_level = cpu_adam::parse_simd_level(options.simd);
    if (!exec.simd_level || !cpu_adam::simd_level_available(*exec.simd_level)) {
      std::cerr << "strata bench adam: --simd \"" << options.simd
                << "\" is not a level this CPU supports (scalar, sse2, avx2, avx512)\n";
      return kExitBadInput;
    }
  }
  const cpu_adam::SimdLevel level = exec.simd_level.value_or(cpu_adam::best_simd_level());
  const std::optional<cpu_adam::StateDType> master_dtype =
      cpu_adam::parse_state_dtype(options.master_dtype);
  if (!master_dtype || *master_dtype == cpu_adam::StateDType::kInt8) {
    std::cerr << "strata bench adam: --master-dtype must be fp32 or bf16\n";
    return kExitBadInput;
  }
  if (options.master_rounding != "stochastic" && options.master_rounding != "kahan") {
    std::cerr << "strata bench adam: --master-rounding \"" << options.master_rounding
              << "\" is not stochastic or kahan\n";
    return kExitBadInput;
  }
  const bool kahan = options.master_rounding == "kahan";
  if (kahan && *master_dtype != cpu_adam::StateDType::kBf16) {
    std::cerr << "strata bench adam: --master-rounding kahan compensates a bf16 master: it needs "
                 "--master-dtype bf16\n";
    return kExitBadInput;
  }
  std::vector<CompressedRow> compressed(options.state_dtypes.size());
  for (std::size_t k = 0; k < compressed.size(); ++k) {
    const std::optional<cpu_adam::StateDType> dtype =
        cpu_adam::parse_state_dtype(options.state_dtypes[k]);
    if (!dtype) {
      std::cerr << "strata bench adam: --state-dtype \"" << options.state_dtypes[k]
                << "\" is not fp32, bf16 or int8\n";
      return kExitBadInput;
    }
    compressed[k].moment_dtype = *dtype;
  }
  // The full-step comparison always writes a 16-bit copy: the one asked for, else bf16.
  const DType copy_dtype = out_dtype.value_or(DType::kBf16);

  tbb::task_arena arena(options.threads);
  HostArray master(count * 4, arena), exp_avg(count * 4, arena), exp_avg_sq(count * 4, arena);
  HostArray grad(count * dtype_bytes(*grad_dtype), arena);
  HostArray arrived(count * dtype_bytes(*grad_dtype), arena);  // the landing source
  HostArray out(count * 2, arena);
  arena.execute([&] {
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, count, 1 << 16), [&](const auto& range) {
      for (std::size_t i = range.begin(); i < range.end(); ++i) {
        master.as<float>()[i] = 0.01f * static_cast<float>(i % 1000) - 5.0f;
        const float g = 1e-3f * static_cast<float>(static_cast<int>(i % 977) - 488);
        switch (*grad_dtype) {
          case DType::kFp32:
            arrived.as<float>()[i] = g;
            break;
          case DType::kBf16:
            arrived.as<Bf16>()[i] = to_bf16(g);
            break;
          case DType::kFp16:
            arrived.as<Fp16>()[i] = to_fp16(g);
            break;
          case DType::kUint8:
          case DType::kUint64:
            break;  // parse_floating_dtype never gives these
        }
      }
    });
  });
  const std::size_t grad_bytes = count * dtype_bytes(*grad_dtype);
  std::memcpy(grad.as<unsigned char>(), arrived.as<unsigned char>(), grad_bytes);

  cpu_adam::ParamSpans spans;
  spans.master = {master.as<float>(), count};
  spans.exp_avg = {exp_avg.as<float>(), count};
  spans.exp_avg_sq = {exp_avg_sq.as<float>(), count};
  spans.grad = ConstTypedSpan(grad.as<void>(), count, *grad_dtype);
  if (out_dtype) spans.param_out = TypedSpan(out.as<void>(), count, *out_dtype);

  cpu_adam::Hyperparams hyper;
  hyper.algorithm = cpu_adam::Algorithm::kAdamW;
  hyper.lr = 1e-4;
  hyper.weight_decay = 0.01;
  const double loss_scale = *grad_dtype == DType::kFp16 ? 1024.0 : 1.0;
  const double max_norm = 1.0;

  // The compressed rows start from the same values, encoded (moments from the zeros of step 0).
  for (CompressedRow& row : compressed) {
    row.master.resize(cpu_adam::state_bytes(*master_dtype, count));
    row.exp_avg.resize(cpu_adam::state_bytes(row.moment_dtype, count));
    row.exp_avg_sq.resize(cpu_adam::state_bytes(row.moment_dtype, count));
    cpu_adam::encode_state(*master_dtype, cpu_adam::MomentKind::kExpAvg, master.as<float>(), count,
                           row.master.data(), arena);
    if (kahan) {
      row.compensation.resize(count * sizeof(Bf16));
      cpu_adam::split_compensated(master.as<float>(), count, row.master.data(),
                                  row.compensation.data(), arena);
    }
    cpu_adam::encode_state(row.moment_dtype, cpu_adam::MomentKind::kExpAvg, exp_avg.as<float>(),
                           count, row.exp_avg.data(), arena);
    cpu_adam::encode_state(row.moment_dtype, cpu_adam::MomentKind::kExpAvgSq,
                           exp_avg_sq.as<float>(), count, row.exp_avg_sq.data(), arena);
    row.bytes_per_param = cpu_adam::compressed_bytes_per_element(
        hyper.algorithm, *master_dtype, row.moment_dtype, *grad_dtype, out_dtype, kahan);
  }

  Figures f;
  f.bytes_per_param = cpu_adam::bytes_per_element(hyper.algorithm, *grad_dtype, out_dtype);
  const int repeats = std::max(1, options.repeats);
  std::int64_t step_index = 0;

  // (a) the memory bound. It is the machine's, so it always streams with the best level.
  const cpu_adam::ExecOptions bound_exec;
  auto run_bound = [&] {
    const Clock::time_point start = Clock::now();
    cpu_adam::stream_bound(spans, arena, bound_exec);
    return seconds_since(start);
  };

  // (b) the optimizer alone.
  auto run_optimizer = [&] {
    hyper.step = ++step_index;
    const Clock::time_point start = Clock::now();
    cpu_adam::step(hyper, spans, cpu_adam::GradScaling{loss_scale, 1.0}, arena, exec);
    return seconds_since(start);
  };

  // (e) the fused compressed step, one sub-group of `count` elements.
  auto run_compressed = [&](CompressedRow& row) {
    cpu_adam::CompressedSpans c;
    c.numel = count;
    c.master_dtype = *master_dtype;
    c.moment_dtype = row.moment_dtype;
    c.master = row.master.data();
    if (!row.compensation.empty()) c.compensation = row.compensation.data();
    c.exp_avg = row.exp_avg.data();
    c.exp_avg_sq = row.exp_avg_sq.data();
    c.grad = spans.grad;
    c.param_out = spans.param_out;
    hyper.step = ++step_index;
    const Clock::time_point start = Clock::now();
    cpu_adam::step_compressed(hyper, c, cpu_adam::GradScaling{loss_scale, 1.0},
                              cpu_adam::StochasticRounding{}, {}, arena, exec);
    return seconds_since(start);
  };

  // (c) fused: the norm is fed chunk by chunk as each chunk of gradient lands (the landing copy
  // stands for the device-to-host transfer and is not timed), then one fused step.
  cpu_adam::ParamSpans fused_spans = spans;
  fused_spans.param_out = TypedSpan(out.as<void>(), count, copy_dtype);
  const std::size_t element_bytes = dtype_bytes(*grad_dtype);
  const std::size_t arrival_elems = 256 * kKiB / element_bytes;  // L2-sized landing chunks
  cpu_adam::GradNormAccumulator norm(exec);
  double fused_norm_s = 0;
  auto run_fused = [&] {
    norm.reset();
    fused_norm_s = 0;
    for (std::size_t begin = 0; begin < count; begin += arrival_elems) {
      const std::size_t n = std::min(arrival_elems, count - begin);
      unsigned char* landed = grad.as<unsigned char>() + begin * element_bytes;
      std::memcpy(landed, arrived.as<unsigned char>() + begin * element_bytes, n * element_bytes);
      const Clock::time_point start = Clock::now();
      norm.add_serial(ConstTypedSpan(landed, n, *grad_dtype));
      fused_norm_s += seconds_since(start);
    }
    const Clock::time_point start = Clock::now();
    const double clip = cpu_adam::clip_coefficient(norm.norm() / loss_scale, max_norm);
    hyper.step = ++step_index;
    cpu_adam::step(hyper, fused_spans, cpu_adam::GradScaling{loss_scale, clip}, arena, exec);
    return fused_norm_s + seconds_since(start);
  };

  // (d) separate passes over DRAM: norm, unscale (and clip) in place, AdamW, cast.
  cpu_adam::ParamSpans plain_spans = spans;
  plain_spans.param_out = TypedSpan();
  double pass_s[4] = {};
  auto run_separate = [&] {
    std::memcpy(grad.as<unsigned char>(), arrived.as<unsigned char>(), grad_bytes);  // untimed
    Clock::time_point start = Clock::now();
    norm.reset();
    norm.add(spans.grad, arena);
    const double clip = cpu_adam::clip_coefficient(norm.norm() / loss_scale, max_norm);
    pass_s[0] = seconds_since(start);
    start = Clock::now();
    cpu_adam::scale_in_place(TypedSpan(grad.as<void>(), count, *grad_dtype),
                             static_cast<float>(clip / loss_scale), arena, exec);
    pass_s[1] = seconds_since(start);
    start = Clock::now();
    hyper.step = ++step_index;
    cpu_adam::step(hyper, plain_spans, cpu_adam::GradScaling{}, arena, exec);
    pass_s[2] = seconds_since(start);
    start = Clock::now();
    cpu_adam::convert(ConstTypedSpan(master.as<float>(), count, DType::kFp32),
                      TypedSpan(out.as<void>(), count, copy_dtype), arena, exec);
    pass_s[3] = seconds_since(start);
    return pass_s[0] + pass_s[1] + pass_s[2] + pass_s[3];
  };

  // The four are interleaved within each repeat, so all see the same machine load (other
  // processes share the memory bandwidth); the best of each is kept.
  run_bound();  // warm-up
  f.bound_s = f.optimizer_s = f.fused_s = f.separate_s = 1e300;
  for (int r = 0; r < repeats; ++r) {
    f.bound_s = std::min(f.bound_s, run_bound());
    f.optimizer_s = std::min(f.optimizer_s, run_optimizer());
    for (CompressedRow& row : compressed) row.seconds = std::min(row.seconds, run_compressed(row));
    const double fused = run_fused();
    if (fused < f.fused_s) {
      f.fused_s = fused;
      f.fused_norm_s = fused_norm_s;
    }
    const double separate = run_separate();
    if (separate < f.separate_s) {
      f.separate_s = separate;
      std::copy(pass_s, pass_s + 4, f.separate_pass_s);
    }
  }
  f.full_step_bytes_fused = cpu_adam::bytes_per_element(hyper.algorithm, *grad_dtype, copy_dtype);
  f.full_step_bytes_separate = element_bytes + 2 * element_bytes +
                               cpu_adam::bytes_per_element(hyper.algorithm, *grad_dtype, {}) + 4 +
                               dtype_bytes(copy_dtype);

  const double n = static_cast<double>(count);
  const double params_per_s = n / f.optimizer_s;
  const double gb_per_s = n * static_cast<double>(f.bytes_per_param) / f.optimizer_s / 1e9;
  const double bound_gb_per_s = n * static_cast<double>(f.bytes_per_param) / f.bound_s / 1e9;
  const double ratio = gb_per_s / bound_gb_per_s;
  const double fused_speedup = f.separate_s / f.fused_s;
  const std::string level_name(cpu_adam::simd_level_name(level));

  if (options.json) {
    nlohmann::json j;
    j["params"] = count;
    j["threads"] = options.threads;
    j["grad_dtype"] = options.grad_dtype;
    j["param_out"] = options.param_out;
    j["simd"] = level_name;
    j["repeats"] = repeats;
    j["load_average"] = load_average();
    j["bytes_per_param"] = f.bytes_per_param;
    j["bound_s"] = f.bound_s;
    j["optimizer_s"] = f.optimizer_s;
    j["params_per_s"] = params_per_s;
    j["gb_per_s"] = gb_per_s;
    j["bound_gb_per_s"] = bound_gb_per_s;
    j["ratio"] = ratio;
    j["fused_step_s"] = f.fused_s;
    j["fused_norm_s"] = f.fused_norm_s;
    j["separate_passes_s"] = f.separate_s;
    j["separate_norm_pass_s"] = f.separate_pass_s[0];
    j["norm_pass_gb_per_s"] = n * static_cast<double>(element_bytes) / f.separate_pass_s[0] / 1e9;
    j["fused_speedup"] = fused_speedup;
    j["master_dtype"] = options.master_dtype;
    j["master_rounding"] = options.master_rounding;
    nlohmann::json rows = nlohmann::json::array();
    for (const CompressedRow& row : compressed) {
      rows.push_back({{"state_dtype", std::string(cpu_adam::state_dtype_name(row.moment_dtype))},
                      {"seconds", row.seconds},
                      {"bytes_per_param", row.bytes_per_param},
                      {"gb_per_s", n * row.bytes_per_param / row.seconds / 1e9},
                      {"ns_per_element", row.seconds / n * 1e9},
                      {"time_ratio", row.seconds / f.optimizer_s}});
    }
    j["compressed"] = rows;
    std::cout << j.dump() << "\n";
    return 0;
  }
  std::printf(
      "strata bench adam: %zu params, %d thread(s), grad %s, param-out %s, simd %s, "
      "best of %d, load average %.2f\n",
      count, options.threads, options.grad_dtype.c_str(), options.param_out.c_str(),
      level_name.c_str(), repeats, load_average());
  std::printf("  %-48s %9s %12s %9s %8s\n", "", "ms", "params/s", "GB/s", "ns/elem");
  auto row = [&](const char* name, double seconds, double bytes) {
    std::printf("  %-48s %9.1f %12.3e %9.1f %8.3f\n", name, seconds * 1e3, n / seconds,
                n * bytes / seconds / 1e9, seconds / n * 1e9);
  };
  const auto bytes = [](std::size_t b) { return static_cast<double>(b); };
  row("(a) memory bound (same arrays, no arithmetic)", f.bound_s, bytes(f.bytes_per_param));
  row("(b) AdamW", f.optimizer_s, bytes(f.bytes_per_param));
  std::printf("  ratio optimizer / bound: %.3f   (%zu bytes per parameter)\n", ratio,
              f.bytes_per_param);
  for (const CompressedRow& c : compressed) {
    const std::string name = "(e) AdamW compressed: " + options.master_dtype +
                             (options.master_rounding == "kahan" ? " master + kahan, " : " master, ") +
                             std::string(cpu_adam::state_dtype_name(c.moment_dtype)) + " moments";
    row(name.c_str(), c.seconds, c.bytes_per_param);
    std::printf(
        "      time per element / (b): %.2fx   (%.3f bytes per parameter, %.2fx of (b)'s)\n",
        c.seconds / f.optimizer_s, c.bytes_per_param, c.bytes_per_param / bytes(f.bytes_per_param));
  }
  row("(c) fused full step", f.fused_s, bytes(f.full_step_bytes_fused));
  std::printf("      of which the norm, fed chunk by chunk as gradients land: %.1f ms\n",
              f.fused_norm_s * 1e3);
  row("(d) separate passes", f.separate_s, bytes(f.full_step_bytes_separate));
  std::printf("      norm %.1f ms (%.1f GB/s), unscale %.1f ms, AdamW %.1f ms, cast %.1f ms\n",
              f.separate_pass_s[0] * 1e3,
              n * static_cast<double>(element_bytes) / f.separate_pass_s[0] / 1e9,
              f.separate_pass_s[1] * 1e3, f.separate_pass_s[2] * 1e3, f.separate_pass_s[3] * 1e3);
  std::printf(
      "  d/c (fused speed-up): %.2fx   (%s copy-out; DRAM bytes per parameter: fused %zu, "
      "separate %zu)\n",
      fused_speedup, std::string(dtype_name(copy_dtype)).c_str(), f.full_step_bytes_fused,
      f.full_step_bytes_separate);
  return 0;
}

}  // namespace

void add_bench_adam_command(CLI::App& bench) {
  auto options = std::make_shared<BenchAdamOptions>();
  CLI::App* adam = bench.add_subcommand(
      "adam", "CPU AdamW vs its memory bound; fused full step vs separate passes");
  adam->add_option("--params", options->params, "parameter count (default 1e8)");
  adam->add_option("--threads", options->threads, "optimizer threads (default 1)")
      ->check(CLI::Range(1, 1024));
  adam->add_option("--grad-dtype", options->grad_dtype, "fp32 | bf16 | fp16 (default fp32)");
  adam->add_option("--param-out", options->param_out,
                   "none | bf16 | fp16: fused copy of the new weights (default none)");
  adam->add_option("--simd", options->simd,
                   "force a SIMD level: scalar | sse2 | avx2 | avx512 (default: best available)");
  adam->add_option("--state-dtype", options->state_dtypes,
                   "fp32 | bf16 | int8, one or more: also time step_compressed() with moments in "
                   "each format, printed beside (b) (default: none)");
  adam->add_option("--master-dtype", options->master_dtype,
                   "fp32 | bf16: the master format of the --state-dtype rows (default bf16)");
  adam->add_option("--master-rounding", options->master_rounding,
                   "stochastic | kahan: how a bf16 master of those rows rounds (default "
                   "stochastic; kahan adds a bf16 compensation per element)");
  adam->add_option("--repeats", options->repeats, "timed runs per figure; best is kept (default 5)")
      ->check(CLI::Range(1, 1000));
  adam->add_flag("--json", options->json, "print one JSON object");
  adam->callback([options] {
    const int code = run_bench_adam(*options);
    if (code != 0) throw CLI::RuntimeError(code);
  });
}

}  // namespace strata::cli

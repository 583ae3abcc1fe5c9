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

// The options checked: what the benchmark runs with.
struct AdamSetup {
  std::size_t count = 0;
  DType grad_dtype = DType::kFp32;
  std::optional<DType> out_dtype;
  cpu_adam::ExecOptions exec;
  cpu_adam::SimdLevel level = cpu_adam::SimdLevel::kScalar;         // exec's, or the best available
  cpu_adam::StateDType master_dtype = cpu_adam::StateDType::kBf16;  // of the compressed rows
  bool kahan = false;                                               // ... and their rounding
  std::vector<cpu_adam::StateDType> moment_dtypes;                  // one compressed row each
  // The full-step comparison always writes a 16-bit copy: the one asked for, else bf16.
  DType copy_dtype() const { return out_dtype.value_or(DType::kBf16); }
};

// Says what was wrong with the options; the caller returns kExitBadInput.
void report_bad_input(const std::string& message) {
  std::cerr << "strata bench adam: " << message << "\n";
}

std::optional<std::size_t> parse_param_count(const std::string& text) {
  double params_value = 0;
  std::size_t used = 0;
  try {
    params_value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || !(params_value >= 1) || params_value > 1e11) {
    report_bad_input("--params: \"" + text +
                     "\" is not a parameter count between 1 and 1e11 (e.g. 1e8)");
    return std::nullopt;
  }
  return static_cast<std::size_t>(params_value);
}

// --grad-dtype, --param-out and --simd into `setup`; false (reported) when one is wrong.
bool parse_step_options(const BenchAdamOptions& options, AdamSetup& setup) {
  const std::optional<DType> grad_dtype = parse_floating_dtype(options.grad_dtype);
  if (!grad_dtype) {
    report_bad_input("--grad-dtype must be fp32, bf16 or fp16");
    return false;
  }
  setup.grad_dtype = *grad_dtype;
  if (options.param_out != "none") {
    setup.out_dtype = parse_floating_dtype(options.param_out);
    if (!setup.out_dtype || *setup.out_dtype == DType::kFp32) {
      report_bad_input("--param-out must be none, bf16 or fp16");
      return false;
    }
  }
  if (!options.simd.empty()) {
    setup.exec.simd_level = cpu_adam::parse_simd_level(options.simd);
    if (!setup.exec.simd_level || !cpu_adam::simd_level_available(*setup.exec.simd_level)) {
      report_bad_input("--simd \"" + options.simd +
                       "\" is not a level this CPU supports (scalar, sse2, avx2, avx512)");
      return false;
    }
  }
  setup.level = setup.exec.simd_level.value_or(cpu_adam::best_simd_level());
  return true;
}

// --master-dtype, --master-rounding and --state-dtype (the compressed rows) into `setup`.
bool parse_compressed_options(const BenchAdamOptions& options, AdamSetup& setup) {
  const std::optional<cpu_adam::StateDType> master_dtype =
      cpu_adam::parse_state_dtype(options.master_dtype);
  if (!master_dtype || *master_dtype == cpu_adam::StateDType::kInt8) {
    report_bad_input("--master-dtype must be fp32 or bf16");
    return false;
  }
  setup.master_dtype = *master_dtype;
  if (options.master_rounding != "stochastic" && options.master_rounding != "kahan") {
    report_bad_input("--master-rounding \"" + options.master_rounding +
                     "\" is not stochastic or kahan");
    return false;
  }
  setup.kahan = options.master_rounding == "kahan";
  if (setup.kahan && setup.master_dtype != cpu_adam::StateDType::kBf16) {
    report_bad_input(
        "--master-rounding kahan compensates a bf16 master: it needs --master-dtype "
        "bf16");
    return false;
  }
  for (const std::string& text : options.state_dtypes) {
    const std::optional<cpu_adam::StateDType> dtype = cpu_adam::parse_state_dtype(text);
    if (!dtype) {
      report_bad_input("--state-dtype \"" + text + "\" is not fp32, bf16 or int8");
      return false;
    }
    setup.moment_dtypes.push_back(*dtype);
  }
  return true;
}

std::optional<AdamSetup> parse_setup(const BenchAdamOptions& options) {
  AdamSetup setup;
  const std::optional<std::size_t> count = parse_param_count(options.params);
  if (!count) return std::nullopt;
  setup.count = *count;
  if (!parse_step_options(options, setup) || !parse_compressed_options(options, setup)) {
    return std::nullopt;
  }
  return setup;
}

// What every timed case works on: the arrays, their spans, the hyperparameters (each case takes
// the next step number) and the norm accumulator. The arrays are allocated in this order.
struct AdamBench {
  AdamBench(const AdamSetup& checked, int threads)
      : setup(checked),
        count(checked.count),
        element_bytes(dtype_bytes(checked.grad_dtype)),
        arena(threads),
        master(count * 4, arena),
        exp_avg(count * 4, arena),
        exp_avg_sq(count * 4, arena),
        grad(count * element_bytes, arena),
        arrived(count * element_bytes, arena),
        out(count * 2, arena),
        norm(checked.exec) {}

  const AdamSetup& setup;
  const std::size_t count;
  const std::size_t element_bytes;  // of one gradient
  tbb::task_arena arena;
  HostArray master, exp_avg, exp_avg_sq, grad;
  HostArray arrived;                 // the landing source of the gradients
  HostArray out;                     // the 16-bit copy of the new weights
  cpu_adam::ParamSpans spans;        // param_out as --param-out asks
  cpu_adam::ParamSpans fused_spans;  // param_out the copy_dtype() copy
  cpu_adam::ParamSpans plain_spans;  // no param_out
  cpu_adam::Hyperparams hyper;
  double loss_scale = 1.0;
  double max_norm = 1.0;
  std::int64_t step_index = 0;
  cpu_adam::GradNormAccumulator norm;
  std::vector<CompressedRow> compressed;

  std::size_t grad_bytes() const { return count * element_bytes; }
  std::int64_t next_step() { return ++step_index; }
};

// Synthetic master weights and gradients (in --grad-dtype, landed into `grad` as well).
void fill_arrays(AdamBench& bench) {
  const DType grad_dtype = bench.setup.grad_dtype;
  bench.arena.execute([&] {
    tbb::parallel_for(
        tbb::blocked_range<std::size_t>(0, bench.count, 1 << 16), [&](const auto& range) {
          for (std::size_t i = range.begin(); i < range.end(); ++i) {
            bench.master.as<float>()[i] = 0.01f * static_cast<float>(i % 1000) - 5.0f;
            const float g = 1e-3f * static_cast<float>(static_cast<int>(i % 977) - 488);
            switch (grad_dtype) {
              case DType::kFp32:
                bench.arrived.as<float>()[i] = g;
                break;
              case DType::kBf16:
                bench.arrived.as<Bf16>()[i] = to_bf16(g);
                break;
              case DType::kFp16:
                bench.arrived.as<Fp16>()[i] = to_fp16(g);
                break;
              case DType::kUint8:
              case DType::kUint64:
                break;  // parse_floating_dtype never gives these
            }
          }
        });
  });
  std::memcpy(bench.grad.as<unsigned char>(), bench.arrived.as<unsigned char>(),
              bench.grad_bytes());
}

void set_spans_and_hyperparams(AdamBench& bench) {
  const AdamSetup& setup = bench.setup;
  const std::size_t count = bench.count;
  cpu_adam::ParamSpans& spans = bench.spans;
  spans.master = {bench.master.as<float>(), count};
  spans.exp_avg = {bench.exp_avg.as<float>(), count};
  spans.exp_avg_sq = {bench.exp_avg_sq.as<float>(), count};
  spans.grad = ConstTypedSpan(bench.grad.as<void>(), count, setup.grad_dtype);
  if (setup.out_dtype) spans.param_out = TypedSpan(bench.out.as<void>(), count, *setup.out_dtype);
  bench.fused_spans = spans;
  bench.fused_spans.param_out = TypedSpan(bench.out.as<void>(), count, setup.copy_dtype());
  bench.plain_spans = spans;
  bench.plain_spans.param_out = TypedSpan();

  bench.hyper.algorithm = cpu_adam::Algorithm::kAdamW;
  bench.hyper.lr = 1e-4;
  bench.hyper.weight_decay = 0.01;
  bench.loss_scale = setup.grad_dtype == DType::kFp16 ? 1024.0 : 1.0;
}

// The compressed rows start from the same values, encoded (moments from the zeros of step 0).
void encode_compressed_rows(AdamBench& bench) {
  const AdamSetup& setup = bench.setup;
  const std::size_t count = bench.count;
  for (cpu_adam::StateDType moment_dtype : setup.moment_dtypes) {
    CompressedRow& row = bench.compressed.emplace_back();
    row.moment_dtype = moment_dtype;
    row.master.resize(cpu_adam::state_bytes(setup.master_dtype, count));
    row.exp_avg.resize(cpu_adam::state_bytes(row.moment_dtype, count));
    row.exp_avg_sq.resize(cpu_adam::state_bytes(row.moment_dtype, count));
    cpu_adam::encode_state(setup.master_dtype, cpu_adam::MomentKind::kExpAvg,
                           bench.master.as<float>(), count, row.master.data(), bench.arena);
    if (setup.kahan) {
      row.compensation.resize(count * sizeof(Bf16));
      cpu_adam::split_compensated(bench.master.as<float>(), count, row.master.data(),
                                  row.compensation.data(), bench.arena);
    }
    cpu_adam::encode_state(row.moment_dtype, cpu_adam::MomentKind::kExpAvg,
                           bench.exp_avg.as<float>(), count, row.exp_avg.data(), bench.arena);
    cpu_adam::encode_state(row.moment_dtype, cpu_adam::MomentKind::kExpAvgSq,
                           bench.exp_avg_sq.as<float>(), count, row.exp_avg_sq.data(), bench.arena);
    row.bytes_per_param = cpu_adam::compressed_bytes_per_element(
        bench.hyper.algorithm, setup.master_dtype, row.moment_dtype, setup.grad_dtype,
        setup.out_dtype, setup.kahan);
  }
}

// (a) the memory bound. It is the machine's, so it always streams with the best level.
double time_bound(AdamBench& bench) {
  const cpu_adam::ExecOptions bound_exec;
  const Clock::time_point start = Clock::now();
  cpu_adam::stream_bound(bench.spans, bench.arena, bound_exec);
  return seconds_since(start);
}

// (b) the optimizer alone.
double time_optimizer(AdamBench& bench) {
  bench.hyper.step = bench.next_step();
  const Clock::time_point start = Clock::now();
  cpu_adam::step(bench.hyper, bench.spans, cpu_adam::GradScaling{bench.loss_scale, 1.0},
                 bench.arena, bench.setup.exec);
  return seconds_since(start);
}

// (e) the fused compressed step, one sub-group of `count` elements.
double time_compressed(AdamBench& bench, CompressedRow& row) {
  cpu_adam::CompressedSpans c;
  c.numel = bench.count;
  c.master_dtype = bench.setup.master_dtype;
  c.moment_dtype = row.moment_dtype;
  c.master = row.master.data();
  if (!row.compensation.empty()) c.compensation = row.compensation.data();
  c.exp_avg = row.exp_avg.data();
  c.exp_avg_sq = row.exp_avg_sq.data();
  c.grad = bench.spans.grad;
  c.param_out = bench.spans.param_out;
  bench.hyper.step = bench.next_step();
  const Clock::time_point start = Clock::now();
  cpu_adam::step_compressed(bench.hyper, c, cpu_adam::GradScaling{bench.loss_scale, 1.0},
                            cpu_adam::StochasticRounding{}, {}, bench.arena, bench.setup.exec);
  return seconds_since(start);
}

struct FusedTime {
  double total_s = 0;
  double norm_s = 0;  // the part spent feeding the norm
};

// (c) fused: the norm is fed chunk by chunk as each chunk of gradient lands (the landing copy
// stands for the device-to-host transfer and is not timed), then one fused step.
FusedTime time_fused(AdamBench& bench) {
  const std::size_t element_bytes = bench.element_bytes;
  const std::size_t arrival_elems = 256 * kKiB / element_bytes;  // L2-sized landing chunks
  FusedTime time;
  bench.norm.reset();
  for (std::size_t begin = 0; begin < bench.count; begin += arrival_elems) {
    const std::size_t n = std::min(arrival_elems, bench.count - begin);
    unsigned char* landed = bench.grad.as<unsigned char>() + begin * element_bytes;
    std::memcpy(landed, bench.arrived.as<unsigned char>() + begin * element_bytes,
                n * element_bytes);
    const Clock::time_point start = Clock::now();
    bench.norm.add_serial(ConstTypedSpan(landed, n, bench.setup.grad_dtype));
    time.norm_s += seconds_since(start);
  }
  const Clock::time_point start = Clock::now();
  const double clip =
      cpu_adam::clip_coefficient(bench.norm.norm() / bench.loss_scale, bench.max_norm);
  bench.hyper.step = bench.next_step();
  cpu_adam::step(bench.hyper, bench.fused_spans, cpu_adam::GradScaling{bench.loss_scale, clip},
                 bench.arena, bench.setup.exec);
  time.total_s = time.norm_s + seconds_since(start);
  return time;
}

struct SeparateTime {
  double total_s = 0;
  double pass_s[4] = {};  // norm, unscale, AdamW, cast
};

// (d) separate passes over DRAM: norm, unscale (and clip) in place, AdamW, cast.
SeparateTime time_separate(AdamBench& bench) {
  const std::size_t count = bench.count;
  const cpu_adam::ExecOptions& exec = bench.setup.exec;
  SeparateTime time;
  std::memcpy(bench.grad.as<unsigned char>(), bench.arrived.as<unsigned char>(),
              bench.grad_bytes());  // untimed
  Clock::time_point start = Clock::now();
  bench.norm.reset();
  bench.norm.add(bench.spans.grad, bench.arena);
  const double clip =
      cpu_adam::clip_coefficient(bench.norm.norm() / bench.loss_scale, bench.max_norm);
  time.pass_s[0] = seconds_since(start);
  start = Clock::now();
  cpu_adam::scale_in_place(TypedSpan(bench.grad.as<void>(), count, bench.setup.grad_dtype),
                           static_cast<float>(clip / bench.loss_scale), bench.arena, exec);
  time.pass_s[1] = seconds_since(start);
  start = Clock::now();
  bench.hyper.step = bench.next_step();
  cpu_adam::step(bench.hyper, bench.plain_spans, cpu_adam::GradScaling{}, bench.arena, exec);
  time.pass_s[2] = seconds_since(start);
  start = Clock::now();
  cpu_adam::convert(ConstTypedSpan(bench.master.as<float>(), count, DType::kFp32),
                    TypedSpan(bench.out.as<void>(), count, bench.setup.copy_dtype()), bench.arena,
                    exec);
  time.pass_s[3] = seconds_since(start);
  time.total_s = time.pass_s[0] + time.pass_s[1] + time.pass_s[2] + time.pass_s[3];
  return time;
}

// The cases are interleaved within each repeat, so all see the same machine load (other
// processes share the memory bandwidth); the best of each is kept.
Figures measure(AdamBench& bench, int repeats) {
  Figures f;
  time_bound(bench);  // warm-up
  f.bound_s = f.optimizer_s = f.fused_s = f.separate_s = 1e300;
  for (int r = 0; r < repeats; ++r) {
    f.bound_s = std::min(f.bound_s, time_bound(bench));
    f.optimizer_s = std::min(f.optimizer_s, time_optimizer(bench));
    for (CompressedRow& row : bench.compressed) {
      row.seconds = std::min(row.seconds, time_compressed(bench, row));
    }
    const FusedTime fused = time_fused(bench);
    if (fused.total_s < f.fused_s) {
      f.fused_s = fused.total_s;
      f.fused_norm_s = fused.norm_s;
    }
    const SeparateTime separate = time_separate(bench);
    if (separate.total_s < f.separate_s) {
      f.separate_s = separate.total_s;
      std::copy(separate.pass_s, separate.pass_s + 4, f.separate_pass_s);
    }
  }
  return f;
}

// Bytes per parameter of each figure, as the arithmetic of the access pattern counts them.
void count_bytes(const AdamBench& bench, Figures& f) {
  const AdamSetup& setup = bench.setup;
  const std::size_t element_bytes = bench.element_bytes;
  f.bytes_per_param =
      cpu_adam::bytes_per_element(bench.hyper.algorithm, setup.grad_dtype, setup.out_dtype);
  f.full_step_bytes_fused =
      cpu_adam::bytes_per_element(bench.hyper.algorithm, setup.grad_dtype, setup.copy_dtype());
  f.full_step_bytes_separate =
      element_bytes + 2 * element_bytes +
      cpu_adam::bytes_per_element(bench.hyper.algorithm, setup.grad_dtype, {}) + 4 +
      dtype_bytes(setup.copy_dtype());
}

// The rates printed, from the best times.
struct Rates {
  double n = 0;  // parameters
  double params_per_s = 0;
  double gb_per_s = 0;
  double bound_gb_per_s = 0;
  double ratio = 0;  // optimizer / bound
  double fused_speedup = 0;
  double norm_pass_gb_per_s = 0;
};

Rates rates_of(const AdamBench& bench, const Figures& f) {
  Rates r;
  r.n = static_cast<double>(bench.count);
  r.params_per_s = r.n / f.optimizer_s;
  r.gb_per_s = r.n * static_cast<double>(f.bytes_per_param) / f.optimizer_s / 1e9;
  r.bound_gb_per_s = r.n * static_cast<double>(f.bytes_per_param) / f.bound_s / 1e9;
  r.ratio = r.gb_per_s / r.bound_gb_per_s;
  r.fused_speedup = f.separate_s / f.fused_s;
  r.norm_pass_gb_per_s =
      r.n * static_cast<double>(bench.element_bytes) / f.separate_pass_s[0] / 1e9;
  return r;
}

void print_json(const BenchAdamOptions& options, const AdamBench& bench, const Figures& f,
                int repeats) {
  const Rates r = rates_of(bench, f);
  nlohmann::json j;
  j["params"] = bench.count;
  j["threads"] = options.threads;
  j["grad_dtype"] = options.grad_dtype;
  j["param_out"] = options.param_out;
  j["simd"] = std::string(cpu_adam::simd_level_name(bench.setup.level));
  j["repeats"] = repeats;
  j["load_average"] = load_average();
  j["bytes_per_param"] = f.bytes_per_param;
  j["bound_s"] = f.bound_s;
  j["optimizer_s"] = f.optimizer_s;
  j["params_per_s"] = r.params_per_s;
  j["gb_per_s"] = r.gb_per_s;
  j["bound_gb_per_s"] = r.bound_gb_per_s;
  j["ratio"] = r.ratio;
  j["fused_step_s"] = f.fused_s;
  j["fused_norm_s"] = f.fused_norm_s;
  j["separate_passes_s"] = f.separate_s;
  j["separate_norm_pass_s"] = f.separate_pass_s[0];
  j["norm_pass_gb_per_s"] = r.norm_pass_gb_per_s;
  j["fused_speedup"] = r.fused_speedup;
  j["master_dtype"] = options.master_dtype;
  j["master_rounding"] = options.master_rounding;
  nlohmann::json rows = nlohmann::json::array();
  for (const CompressedRow& row : bench.compressed) {
    rows.push_back({{"state_dtype", std::string(cpu_adam::state_dtype_name(row.moment_dtype))},
                    {"seconds", row.seconds},
                    {"bytes_per_param", row.bytes_per_param},
                    {"gb_per_s", r.n * row.bytes_per_param / row.seconds / 1e9},
                    {"ns_per_element", row.seconds / r.n * 1e9},
                    {"time_ratio", row.seconds / f.optimizer_s}});
  }
  j["compressed"] = rows;
  std::cout << j.dump() << "\n";
}

// One row of the table: time, rates and the bytes per parameter the GB/s count.
void print_row(const char* name, double n, double seconds, double bytes) {
  std::printf("  %-48s %9.1f %12.3e %9.1f %8.3f\n", name, seconds * 1e3, n / seconds,
              n * bytes / seconds / 1e9, seconds / n * 1e9);
}

// The (e) rows, each beside (b).
void print_compressed_rows(const BenchAdamOptions& options, const AdamBench& bench,
                           const Figures& f) {
  const double n = static_cast<double>(bench.count);
  for (const CompressedRow& c : bench.compressed) {
    const std::string name =
        "(e) AdamW compressed: " + options.master_dtype +
        (options.master_rounding == "kahan" ? " master + kahan, " : " master, ") +
        std::string(cpu_adam::state_dtype_name(c.moment_dtype)) + " moments";
    print_row(name.c_str(), n, c.seconds, c.bytes_per_param);
    std::printf(
        "      time per element / (b): %.2fx   (%.3f bytes per parameter, %.2fx of (b)'s)\n",
        c.seconds / f.optimizer_s, c.bytes_per_param,
        c.bytes_per_param / static_cast<double>(f.bytes_per_param));
  }
}

void print_text(const BenchAdamOptions& options, const AdamBench& bench, const Figures& f,
                int repeats) {
  const Rates r = rates_of(bench, f);
  const std::string level_name(cpu_adam::simd_level_name(bench.setup.level));
  std::printf(
      "strata bench adam: %zu params, %d thread(s), grad %s, param-out %s, simd %s, "
      "best of %d, load average %.2f\n",
      bench.count, options.threads, options.grad_dtype.c_str(), options.param_out.c_str(),
      level_name.c_str(), repeats, load_average());
  std::printf("  %-48s %9s %12s %9s %8s\n", "", "ms", "params/s", "GB/s", "ns/elem");
  const auto bytes = [](std::size_t b) { return static_cast<double>(b); };
  print_row("(a) memory bound (same arrays, no arithmetic)", r.n, f.bound_s,
            bytes(f.bytes_per_param));
  print_row("(b) AdamW", r.n, f.optimizer_s, bytes(f.bytes_per_param));
  std::printf("  ratio optimizer / bound: %.3f   (%zu bytes per parameter)\n", r.ratio,
              f.bytes_per_param);
  print_compressed_rows(options, bench, f);
  print_row("(c) fused full step", r.n, f.fused_s, bytes(f.full_step_bytes_fused));
  std::printf("      of which the norm, fed chunk by chunk as gradients land: %.1f ms\n",
              f.fused_norm_s * 1e3);
  print_row("(d) separate passes", r.n, f.separate_s, bytes(f.full_step_bytes_separate));
  std::printf("      norm %.1f ms (%.1f GB/s), unscale %.1f ms, AdamW %.1f ms, cast %.1f ms\n",
              f.separate_pass_s[0] * 1e3, r.norm_pass_gb_per_s, f.separate_pass_s[1] * 1e3,
              f.separate_pass_s[2] * 1e3, f.separate_pass_s[3] * 1e3);
  std::printf(
      "  d/c (fused speed-up): %.2fx   (%s copy-out; DRAM bytes per parameter: fused %zu, "
      "separate %zu)\n",
      r.fused_speedup, std::string(dtype_name(bench.setup.copy_dtype())).c_str(),
      f.full_step_bytes_fused, f.full_step_bytes_separate);
}

int run_bench_adam(const BenchAdamOptions& options) {
  const std::optional<AdamSetup> setup = parse_setup(options);
  if (!setup) return kExitBadInput;
  AdamBench bench(*setup, options.threads);
  fill_arrays(bench);
  set_spans_and_hyperparams(bench);
  encode_compressed_rows(bench);
  const int repeats = std::max(1, options.repeats);
  Figures f = measure(bench, repeats);
  count_bytes(bench, f);
  if (options.json) {
    print_json(options, bench, f, repeats);
  } else {
    print_text(options, bench, f, repeats);
  }
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

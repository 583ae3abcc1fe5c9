// The machinery of optimizer_case.hpp: state generation, the device copies with their guards, the
// host reference and the byte comparison.
#include "tests/tiers/device/optimizer_case.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <sstream>

#include "base/float16.hpp"

namespace strata::tiers::testing {
namespace {

using cpu_adam::StateDType;

constexpr std::uint64_t kGuardBytes = 64;
constexpr std::uint8_t kGuard = 0xC3;
constexpr std::uint8_t kPoison = 0xFF;     // NaN in every float format
constexpr std::uint8_t kStaleCode = 0x5A;  // int8 codes past the last element, before a step

// Every step must stay finite for the bytes to be comparable: a NaN the arithmetic makes is the
// GPU's canonical NaN and x86's default one. Weights of 1e18 did not: with L2 decay (Adam) their
// gradient is 1e16, which int8 moments crush to v = 0 beside m != 0 in other elements of the
// block; m / eps then grows the weights until g * g overflows by step 3. Gradients of 1e18
// (squares 1e36) stay; the state's largest edge value is 1e4.
constexpr float kLargeState = 1e4f;

// splitmix64: fast, and a pure function of the seed.
class Random {
 public:
  explicit Random(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Random sign, magnitude in [2^min_exp, 2^max_exp); one value in 32 an edge value (zeros,
  // denormals, the smallest normal, a tiny magnitude, `large`).
  float value(int min_exp, int max_exp, float large) {
    const std::uint64_t bits = next();
    const float sign = (bits & 1) != 0 ? -1.0f : 1.0f;
    if ((bits >> 1) % 32 == 0) {
      switch ((bits >> 6) % 6) {
        case 0:
          return 0.0f;
        case 1:
          return -0.0f;
        case 2:
          return sign * 1e-40f;  // fp32 denormal (bf16: denormal; fp16: 0)
        case 3:
          return sign * 1.17549435e-38f;
        case 4:
          return sign * 1e-30f;
        default:
          return sign * large;
      }
    }
    const float mantissa = 1.0f + static_cast<float>((bits >> 8) & 0xFFFFFF) * 0x1p-24f;
    const int span = max_exp - min_exp;
    const int exponent =
        min_exp + static_cast<int>((bits >> 40) % static_cast<std::uint64_t>(span));
    return sign * std::ldexp(mantissa, exponent);
  }

 private:
  std::uint64_t state_;
};

void store_value(std::byte* data, std::uint64_t i, DType dtype, float value) {
  switch (dtype) {
    case DType::kFp32:
      std::memcpy(data + 4 * i, &value, 4);
      return;
    case DType::kBf16: {
      const Bf16 narrow = to_bf16(value);
      std::memcpy(data + 2 * i, &narrow, 2);
      return;
    }
    case DType::kFp16: {
      const Fp16 narrow = to_fp16(value);
      std::memcpy(data + 2 * i, &narrow, 2);
      return;
    }
    case DType::kUint8:
    case DType::kUint64:
      break;
  }
  FAIL() << "not a floating dtype";
}

// The host reference's arrays (empty: absent) and their device twins.
struct Arrays {
  std::vector<std::byte> master, compensation, exp_avg, exp_avg_sq, grad, param_out;
};

enum class ArrayKind { kMaster, kCompensation, kExpAvg, kExpAvgSq, kGrad, kParamOut };
constexpr ArrayKind kArrayKinds[] = {ArrayKind::kMaster, ArrayKind::kCompensation,
                                     ArrayKind::kExpAvg, ArrayKind::kExpAvgSq,
                                     ArrayKind::kGrad,   ArrayKind::kParamOut};

const char* array_name(ArrayKind kind) {
  constexpr const char* kNames[] = {"master",     "compensation", "exp_avg",
                                    "exp_avg_sq", "grad",         "param_out"};
  return kNames[static_cast<int>(kind)];
}

std::vector<std::byte>& array_of(Arrays& arrays, ArrayKind kind) {
  switch (kind) {
    case ArrayKind::kMaster:
      return arrays.master;
    case ArrayKind::kCompensation:
      return arrays.compensation;
    case ArrayKind::kExpAvg:
      return arrays.exp_avg;
    case ArrayKind::kExpAvgSq:
      return arrays.exp_avg_sq;
    case ArrayKind::kGrad:
      return arrays.grad;
    case ArrayKind::kParamOut:
      return arrays.param_out;
  }
  return arrays.master;
}

// Bytes of one element of `kind` (int8 moments: 4, the alignment their codes are read with), the
// shift of a misaligned shape.
std::uint64_t element_bytes(const OptimizerCase& c, ArrayKind kind) {
  switch (kind) {
    case ArrayKind::kMaster:
      return c.format.master == StateDType::kFp32 ? 4 : 2;
    case ArrayKind::kCompensation:
    case ArrayKind::kParamOut:
      return 2;
    case ArrayKind::kExpAvg:
    case ArrayKind::kExpAvgSq:
      return c.format.moments == StateDType::kBf16 ? 2 : 4;
    case ArrayKind::kGrad:
      return dtype_bytes(c.grad_dtype);
  }
  return 4;
}

Arrays random_state(const OptimizerCase& c, std::uint64_t numel, std::uint64_t seed,
                    tbb::task_arena& arena) {
  Random random(seed);
  std::vector<float> master(numel), exp_avg(numel), exp_avg_sq(numel);
  for (std::uint64_t i = 0; i < numel; ++i) {
    master[i] = random.value(-6, 2, kLargeState);
    exp_avg[i] = random.value(-12, -4, kLargeState);
    exp_avg_sq[i] = std::fabs(random.value(-24, -8, kLargeState));
  }
  Arrays arrays;
  arrays.master.resize(cpu_adam::state_bytes(c.format.master, numel));
  arrays.exp_avg.resize(cpu_adam::state_bytes(c.format.moments, numel));
  arrays.exp_avg_sq.resize(cpu_adam::state_bytes(c.format.moments, numel));
  using cpu_adam::MomentKind;
  if (c.format.kahan) {
    arrays.compensation.resize(numel * sizeof(Bf16));
    cpu_adam::split_compensated(master.data(), numel, arrays.master.data(),
                                arrays.compensation.data(), arena);
  } else {
    cpu_adam::encode_state(c.format.master, MomentKind::kExpAvg, master.data(), numel,
                           arrays.master.data(), arena);
  }
  cpu_adam::encode_state(c.format.moments, MomentKind::kExpAvg, exp_avg.data(), numel,
                         arrays.exp_avg.data(), arena);
  cpu_adam::encode_state(c.format.moments, MomentKind::kExpAvgSq, exp_avg_sq.data(), numel,
                         arrays.exp_avg_sq.data(), arena);
  if (c.format.moments == StateDType::kInt8 && numel % cpu_adam::kQuantBlockElems != 0) {
    // Stale codes past the last element: the step must zero them, as encode_state did.
    const std::uint64_t used = numel % cpu_adam::kQuantBlockElems;
    const std::uint64_t tail = arrays.exp_avg.size() - (cpu_adam::kQuantBlockElems - used);
    std::fill(arrays.exp_avg.begin() + static_cast<std::ptrdiff_t>(tail), arrays.exp_avg.end(),
              std::byte{kStaleCode});
    std::fill(arrays.exp_avg_sq.begin() + static_cast<std::ptrdiff_t>(tail),
              arrays.exp_avg_sq.end(), std::byte{kStaleCode});
  }
  arrays.grad.resize(numel * dtype_bytes(c.grad_dtype));
  if (c.out_dtype) arrays.param_out.assign(numel * 2, std::byte{kPoison});
  return arrays;
}

// One device array: `offset` bytes in, guard bytes before and after.
struct DeviceArray {
  DeviceBuffer buffer;
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
  std::byte* data() const { return bytes == 0 ? nullptr : buffer.data() + offset; }
  DeviceSpan span() const { return buffer.span(offset, bytes); }
};

DeviceArray place(Device& device, Stream& stream, const std::vector<std::byte>& host,
                  std::uint64_t offset) {
  DeviceArray array;
  if (host.empty()) return array;
  array.offset = offset;
  array.bytes = host.size();
  array.buffer = device.allocate(offset + host.size() + kGuardBytes);
  std::vector<std::byte> image(array.buffer.bytes(), std::byte{kGuard});
  std::copy(host.begin(), host.end(), image.begin() + static_cast<std::ptrdiff_t>(offset));
  stream.copy_to_device(array.buffer.span(), image.data());
  stream.synchronize();  // `image` dies here
  return array;
}

// Each case draws its own inputs: the seed mixed with the case's name (FNV-1a).
std::uint64_t case_seed(const OptimizerCase& c, std::uint64_t base_seed) {
  std::uint64_t hash = 0xCBF29CE484222325ull;
  for (const char ch : case_name(c))
    hash = (hash ^ static_cast<unsigned char>(ch)) * 0x100000001B3ull;
  return base_seed ^ hash;
}

std::string shape_note(const OptimizerCase& c, const Shape& shape, std::uint64_t seed, int step) {
  std::ostringstream note;
  note << case_name(c) << ", numel " << shape.numel << (shape.misaligned ? " misaligned" : "")
       << ", first element " << shape.first_element << ", step " << step << ", seed " << seed
       << " (rerun with STRATA_TEST_SEED=" << seed << ")";
  return note.str();
}

// The device array against the host's bytes and its guards; false (and a failure) on the first
// difference.
bool same_bytes(Stream& stream, const DeviceArray& array, const std::vector<std::byte>& host,
                ArrayKind kind, const std::string& note) {
  if (array.bytes == 0) return true;
  std::vector<std::byte> image(array.buffer.bytes());
  stream.copy_to_host(image.data(), array.buffer.span());
  stream.synchronize();
  const std::vector<std::byte> guard(std::max(array.offset, kGuardBytes), std::byte{kGuard});
  const std::uint64_t after = array.offset + array.bytes;
  if (std::memcmp(image.data(), guard.data(), array.offset) == 0 &&
      std::memcmp(image.data() + array.offset, host.data(), array.bytes) == 0 &&
      std::memcmp(image.data() + after, guard.data(), image.size() - after) == 0) {
    return true;
  }
  for (std::uint64_t i = 0; i < image.size(); ++i) {  // the first difference, for the message
    const bool inside = i >= array.offset && i < array.offset + array.bytes;
    const std::byte expected = inside ? host[i - array.offset] : std::byte{kGuard};
    if (image[i] == expected) continue;
    ADD_FAILURE() << array_name(kind) << (inside ? " byte " : " guard byte ")
                  << (inside ? i - array.offset : i) << ": device 0x" << std::hex
                  << static_cast<int>(image[i]) << ", cpu_adam 0x" << static_cast<int>(expected)
                  << std::dec << "; " << note;
    return false;
  }
  return true;
}

// The reference's weights after a step, all finite (see kLargeState); false (and a failure
// naming the first that is not) otherwise.
bool master_finite(const OptimizerCase& c, const Arrays& host, std::uint64_t numel,
                   const std::string& note) {
  for (std::uint64_t i = 0; i < numel; ++i) {
    float value = 0;
    if (c.format.master == StateDType::kFp32) {
      std::memcpy(&value, host.master.data() + 4 * i, 4);
    } else {
      Bf16 weight;
      std::memcpy(&weight, host.master.data() + 2 * i, 2);
      value = to_float(weight);
    }
    if (std::isfinite(value)) continue;
    ADD_FAILURE() << "cpu_adam's master element " << i << " is " << value
                  << ": the inputs left the range where every step stays finite; " << note;
    return false;
  }
  return true;
}

}  // namespace

std::string case_name(const OptimizerCase& c) {
  constexpr const char* kAlgorithms[] = {"adamw", "adam", "adagrad", "lion"};
  std::string name = std::string(kAlgorithms[static_cast<int>(c.algorithm)]) + "_" + c.format.name +
                     "_grad_" + std::string(dtype_name(c.grad_dtype)) + "_out_" +
                     (c.out_dtype ? std::string(dtype_name(*c.out_dtype)) : std::string("none"));
  return name;
}

std::vector<cpu_adam::DecayRun> decay_runs_for(std::uint64_t numel) {
  if (numel < 3) return {};
  const std::uint64_t first = numel / 3 + 1;  // cuts blocks and vectors at odd places
  const std::uint64_t second = numel / 3 + numel / 5;
  return {{0, first, true}, {first, second, false}, {first + second, numel - first - second, true}};
}

cpu_adam::Hyperparams step_hyperparams(cpu_adam::Algorithm algorithm, int step) {
  cpu_adam::Hyperparams h;
  h.algorithm = algorithm;
  h.step = step;
  h.lr = 1e-3 * step;
  h.weight_decay = 0.01;
  h.beta2 = algorithm == cpu_adam::Algorithm::kLion ? 0.99 : 0.999;
  return h;
}

cpu_adam::GradScaling step_scaling(DType grad_dtype, int step) {
  cpu_adam::GradScaling scaling;
  scaling.loss_scale = grad_dtype == DType::kFp16 ? 256.0 : 1.0;
  scaling.clip_coef = step == 2 ? 0.37 : 1.0;
  return scaling;
}

std::vector<std::byte> random_grads(DType dtype, std::uint64_t count, std::uint64_t seed) {
  Random random(seed);
  std::vector<std::byte> grads(count * dtype_bytes(dtype));
  for (std::uint64_t i = 0; i < count; ++i) {
    const float large = dtype == DType::kFp16 ? 60000.0f : 1e18f;  // fp16: below its largest
    store_value(grads.data(), i, dtype, random.value(-16, dtype == DType::kFp16 ? 4 : 0, large));
  }
  return grads;
}

void expect_device_matches_cpu(Device& device, const OptimizerCase& c, const Shape& shape,
                               std::uint64_t base_seed, int steps, tbb::task_arena& arena) {
  const std::uint64_t numel = shape.numel;
  const std::uint64_t seed = case_seed(c, base_seed);
  Arrays host = random_state(c, numel, seed, arena);
  Stream stream = device.create_stream();
  DeviceArray arrays[std::size(kArrayKinds)];
  for (ArrayKind kind : kArrayKinds) {
    const std::uint64_t offset = shape.misaligned ? element_bytes(c, kind) : 0;
    arrays[static_cast<int>(kind)] = place(device, stream, array_of(host, kind), offset);
  }
  const auto device_array = [&](ArrayKind kind) -> const DeviceArray& {
    return arrays[static_cast<int>(kind)];
  };
  const std::vector<cpu_adam::DecayRun> runs = decay_runs_for(numel);
  DeviceBuffer device_runs = device.allocate(runs.size() * sizeof(cpu_adam::DecayRun));
  stream.copy_to_device(device_runs.span(), runs.data());

  for (int step = 1; step <= steps; ++step) {
    const std::string note = shape_note(c, shape, base_seed, step);
    host.grad = random_grads(c.grad_dtype, numel, seed * 31 + static_cast<std::uint64_t>(step));
    stream.copy_to_device(device_array(ArrayKind::kGrad).span(), host.grad.data());
    if (c.out_dtype) stream.fill_bytes(device_array(ArrayKind::kParamOut).span(), kPoison);

    const cpu_adam::StepPlan plan =
        cpu_adam::plan_step(step_hyperparams(c.algorithm, step), step_scaling(c.grad_dtype, step),
                            cpu_adam::StochasticRounding{seed, shape.first_element});
    OptimizerOp op;
    op.plan = plan;
    op.master_dtype = c.format.master;
    op.moment_dtype = c.format.moments;
    op.numel = numel;
    op.master = device_array(ArrayKind::kMaster).data();
    op.compensation = device_array(ArrayKind::kCompensation).data();
    op.exp_avg = device_array(ArrayKind::kExpAvg).data();
    op.exp_avg_sq = device_array(ArrayKind::kExpAvgSq).data();
    op.grad = device_array(ArrayKind::kGrad).data();
    op.grad_dtype = c.grad_dtype;
    op.param_out = device_array(ArrayKind::kParamOut).data();
    op.param_out_dtype = c.out_dtype.value_or(DType::kBf16);
    op.decay_runs = reinterpret_cast<const cpu_adam::DecayRun*>(device_runs.data());
    op.decay_run_count = runs.size();
    stream.optimizer_update(op);

    cpu_adam::CompressedSpans spans;
    spans.numel = numel;
    spans.master_dtype = c.format.master;
    spans.moment_dtype = c.format.moments;
    spans.master = host.master.data();
    spans.compensation = c.format.kahan ? host.compensation.data() : nullptr;
    spans.exp_avg = host.exp_avg.data();
    spans.exp_avg_sq = host.exp_avg_sq.data();
    spans.grad = cpu_adam::ConstTypedSpan(host.grad.data(), numel, c.grad_dtype);
    if (c.out_dtype) {
      std::fill(host.param_out.begin(), host.param_out.end(), std::byte{kPoison});
      spans.param_out = cpu_adam::TypedSpan(host.param_out.data(), numel, *c.out_dtype);
    }
    cpu_adam::step_compressed(plan, spans, runs, arena);
    stream.synchronize();
    if (!master_finite(c, host, numel, note)) return;

    for (ArrayKind kind : kArrayKinds) {
      if (!same_bytes(stream, device_array(kind), array_of(host, kind), kind, note)) return;
    }
  }
}

}  // namespace strata::tiers::testing

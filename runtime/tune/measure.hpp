// The measurements of `strata tune`, each within its share of one time budget: the NVMe grid
// (io_probe.hpp, over the config's paths striped, then each path alone when there are several),
// the fsync after each point's writes, host memory bandwidth (parallel memcpy), XXH3 on one thread
// (the store's checksums), CPU Adam per thread count (over state in memory, in the update the
// config runs: cpu_adam::step for fp32 state, cpu_adam::step_compressed otherwise) and
// pinned host <-> GPU copies when a CUDA device is present. The grid is scaled down to fit its
// share: first the bytes per point, then the number of points; a phase that runs past its
// deadline stops and says so.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "base/dtype.hpp"
#include "base/float16.hpp"
#include "cpu_adam/compressed_step.hpp"
#include "cpu_adam/optimizer.hpp"
#include "runtime/config/config.hpp"
#include "runtime/tune/machine_profile.hpp"

namespace strata::runtime::tune {

struct MeasureOptions {
  double budget_s = 120;
  // [tiers.nvme] paths, direct, engine, budget and [tiers.device] kind: what is measured.
  NvmeTierConfig nvme;
  DeviceKind device = DeviceKind::kAuto;
  // The update Adam is timed on (adam_update(config)) and, for a compressed one, the parameters
  // it writes out (compressed_param_out(config)); the fp32 update writes bf16 parameters.
  AdamUpdate adam_update;
  std::optional<DType> compressed_param_out;
  std::ostream* log = nullptr;  // one line per phase; null: quiet
};

// The parameters the Engine's compressed update writes out under `config`: [precision] params
// when 16-bit and not the master's own bytes (a bf16 master with bf16 parameters), else none.
std::optional<DType> compressed_param_out(const Config& config);

// Throws io::IoError when a path cannot be written.
MachineProfile measure_machine(const MeasureOptions& options);

// Measures the profile's point `index` again and keeps the new figures alone. The grid's best
// point is, among points within the noise of each other, the one whose noise was kindest, so its
// first figures overstate it (the winner's curse); a run taken after the choice is independent of
// it, so it is unbiased (a mean with the grid's run would keep half the bias). Throws io::IoError.
void confirm_io_point(const MeasureOptions& options, MachineProfile& profile, std::size_t index);

// Adam state of `count` elements in memory (fp32 master and moments, bf16 gradients and copy-out,
// as a training step): what `strata tune` and `strata bench step` time CPU Adam on.
class SyntheticAdamState {
 public:
  explicit SyntheticAdamState(std::size_t count);
  // Spans over the first `count` elements (at most the constructor's).
  cpu_adam::ParamSpans spans(std::size_t count) const;

 private:
  mutable std::vector<float> master_, exp_avg_, exp_avg_sq_;
  mutable std::vector<Bf16> grad_, param_out_;
};

// Compressed Adam state of `count` elements in memory, in `update`'s formats (zero bytes decode to
// zero in every format), bf16 gradients and `param_out` parameters written out (none: nullopt):
// what `strata tune` and `strata bench step` time cpu_adam::step_compressed on.
class SyntheticCompressedAdamState {
 public:
  SyntheticCompressedAdamState(const AdamUpdate& update, std::optional<DType> param_out,
                               std::uint64_t count);
  // The first `count` elements (a whole sub-group of at most the constructor's count).
  cpu_adam::CompressedSpans spans(std::uint64_t count);

 private:
  AdamUpdate update_;
  std::optional<DType> param_dtype_;
  std::vector<std::byte> master_, compensation_, exp_avg_, exp_avg_sq_;  // compensation: Kahan
  std::vector<Bf16> grad_;
  std::vector<std::byte> param_out_;
};

}  // namespace strata::runtime::tune

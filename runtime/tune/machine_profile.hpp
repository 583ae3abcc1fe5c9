// What `strata tune` measured on this machine: the figures the cost model (cost_model.hpp) turns
// into a predicted step time. Filled by measure.hpp, or by hand in tests (synthetic machines).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cpu_adam/state_dtype.hpp"

namespace strata::runtime::tune {

// One point of the NVMe grid, over the config's paths striped. MB/s are 1e6 bytes per second.
struct IoPoint {
  std::uint64_t block_bytes = 0;
  std::uint32_t queue_depth = 0;
  std::uint32_t rings = 0;
  double read_mb_per_s = 0;
  double write_mb_per_s = 0;
  double mixed_mb_per_s = 0;  // reads and writes in flight together, half each
  // Bytes written over the seconds of the fsync that makes them durable (io_probe.hpp); 0: not
  // measured, the commit is left out.
  double flush_mb_per_s = 0;
  // Times measured: 1, the grid; 2, confirmed (confirm_io_point), the rates then the second
  // measurement's alone.
  std::uint32_t runs = 1;
  std::uint64_t in_flight_bytes() const { return block_bytes * queue_depth * rings; }
};

// One NVMe path on its own, at the config's block size and depth.
struct PathPoint {
  std::string path;
  double read_mb_per_s = 0;
  double write_mb_per_s = 0;
};

// The update an Adam rate was measured on: cpu_adam::step over fp32 master weights and moments,
// or, when either is kept in another format ([optimizer] master_dtype, state_dtype), the fused
// cpu_adam::step_compressed the Engine then runs (decode, update, encode per block).
struct AdamUpdate {
  cpu_adam::StateDType master_dtype = cpu_adam::StateDType::kFp32;
  cpu_adam::StateDType state_dtype = cpu_adam::StateDType::kFp32;
  bool kahan = false;  // a bf16 master with its compensation ([optimizer] master_rounding)
  bool compressed() const {
    return master_dtype != cpu_adam::StateDType::kFp32 ||
           state_dtype != cpu_adam::StateDType::kFp32;
  }
  bool operator==(const AdamUpdate&) const = default;
};

// CPU Adam over state in memory with `threads` threads, in `update`'s formats.
struct AdamPoint {
  std::uint32_t threads = 0;
  double params_per_s = 0;
  AdamUpdate update = {};  // default: the fp32 cpu_adam::step
};

struct MachineProfile {
  std::vector<IoPoint> io;  // empty: no NVMe path to measure
  // The I/O grid's own noise: the largest relative difference of a confirmed point's mixed rate
  // between its grid run and its confirmation (confirm_io_point); 0 until one is confirmed.
  double io_noise = 0;
  // The point of `io` the Engine's own optimizer step ran fastest with, timed on the chosen config
  // (runtime/cli/tune_calibrate.hpp's choose_io_point_on_engine); when set, the choice takes it.
  std::optional<std::size_t> engine_io_point;
  // The factor on the probe's mixed rates at which the cost model predicts the Engine's own
  // optimizer step timed there (fit_engine_io_scale, cost_model.hpp): the pipeline's hand-offs,
  // its read/write mix and the page cache move its bytes faster or slower than the raw probe's
  // 50/50 mix. 1: not calibrated.
  double engine_io_scale = 1;
  std::vector<PathPoint> paths;
  double host_memory_gb_per_s = 0;  // parallel memcpy, 1e9 bytes per second each way
  std::vector<AdamPoint> adam;      // at least one point, of the update the config runs
  // XXH3 on one thread, 1e9 bytes per second: the NVMe store's checksum thread hashes every byte
  // it reads and writes (tiers/checksum_worker.hpp). 0: not measured, left out.
  double checksum_gb_per_s = 0;
  // Pinned host <-> GPU copies; nullopt without a CUDA device (gpu_note says why).
  std::optional<double> h2d_gb_per_s;
  std::optional<double> d2h_gb_per_s;
  std::string gpu_note;
  // What each optimizer sub-group streamed from NVMe costs beyond its bytes (hand-offs between
  // threads), calibrated on the Engine (runtime/cli/tune_calibrate.hpp); 0: left out.
  double sub_group_overhead_s = 0;
  // Forward + backward arithmetic rate (FLOP/s) for the compute estimate; 0 leaves compute out.
  double compute_flops = 0;
};

}  // namespace strata::runtime::tune

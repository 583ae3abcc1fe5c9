// The PCIe bytes one optimizer step moves between host and device memory on the CUDA data path
// (runtime/engine/device_lanes.cpp), per rank and per direction, and the time they take at an
// assumed link rate: what `strata plan` prints beside the NVMe traffic. Counted from the buffer
// plan, the way the Engine's staged path copies (docs/design.md, "The CUDA data path"):
// - gathers: the own parameter shard h2d when its home is host memory or NVMe (one rank); with
//   several ranks the collective runs on the host (the plan's data path: MpiComm), so the whole
//   padded unit goes h2d from the pinned slot, and a device home's own shard first d2h to it;
// - gradients: every reduce_grads call (one per micro-batch) copies the padded fp32 gradient d2h
//   when its home is host memory or NVMe, or when several ranks reduce it on the host, and then
//   the reduced fp32 shard of a device home h2d;
// - the optimizer step: a sub-group the CPU updates has its device-homed kinds staged d2h before
//   the update (stage_in: master, moments, gradient) and h2d after it (stage_out: master,
//   moments, parameters); a sub-group whose every kind is on the device is updated there.
// The global norm's 8-byte readback per step is left out.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/config/config.hpp"
#include "runtime/plan/buffer_plan.hpp"

namespace strata::runtime {

// The link rate `strata plan` assumes each way unless told (--pcie-gbps): a PCIe Gen4 x16 link's
// practical rate per direction (Gen5 x16, as on H100/H200 servers: about 50 GB/s).
inline constexpr double kAssumedPcieBytesPerS = 25e9;

struct PcieInputs {
  std::vector<std::uint64_t> unit_numels;  // real elements of each unit, in order
  std::uint32_t ranks = 1;
  std::uint32_t micro_batches = 1;  // [model] grad_accumulation: reduce_grads calls per unit
  // Of the gathered copies of the units the device does not keep for the whole step, the share
  // the device's unit cache holds from one use to the next (0: every use gathers again; 1: every
  // unit is gathered once per step).
  double resident_fraction = 0;
  double link_bytes_per_s = kAssumedPcieBytesPerS;  // each way
};

struct PcieTraffic {
  // Host to device.
  std::uint64_t gather_h2d_bytes = 0;     // parameters gathered for the forward and backward
  std::uint64_t grad_h2d_bytes = 0;       // reduced shards of device-homed gradients
  std::uint64_t optimizer_h2d_bytes = 0;  // stage_out of device-homed state after a CPU update
  // Device to host.
  std::uint64_t gather_d2h_bytes = 0;     // device-homed own shards, for a gather on the host
  std::uint64_t grad_d2h_bytes = 0;       // gradients, every micro-batch
  std::uint64_t optimizer_d2h_bytes = 0;  // stage_in of device-homed state before a CPU update
  double gathers_per_unit = 0;            // gathers of a unit per step, averaged over the units
  double link_bytes_per_s = kAssumedPcieBytesPerS;

  std::uint64_t h2d_bytes() const {
    return gather_h2d_bytes + grad_h2d_bytes + optimizer_h2d_bytes;
  }
  std::uint64_t d2h_bytes() const {
    return gather_d2h_bytes + grad_d2h_bytes + optimizer_d2h_bytes;
  }
  // The least time the copies take per step: the two directions run at once (full duplex), so
  // the busier one bounds the step.
  double bound_s() const;
};

// How many times one unit is gathered per optimizer step of `micro_batches` micro-batches: a
// unit kept gathered for the whole step (stages 0-2, and units under [zero]
// persistence_threshold) once; otherwise each micro-batch's forward and backward gather it (2m),
// less what the unit cache keeps across each of the 2m - 1 turns between them (forward to
// backward, backward to the next forward) that the cache spans: 2m - (2m - 1) r, which is 1 when
// the cache holds every unit (r = 1). The step itself makes every gathered copy stale.
double gathers_per_step(bool kept_all_step, std::uint32_t micro_batches, double resident_fraction);

PcieTraffic count_pcie_traffic(const Config& config, const BufferPlan& buffers,
                               const PcieInputs& inputs);

}  // namespace strata::runtime

// The Engine's data path to device memory (docs/design.md, "The CUDA data path"). When the device's
// memory is host memory (the host device) the Engine addresses it directly: memcpy, CPU loops and
// collectives in place. Otherwise (CUDA, or EngineOptions::DeviceAccess::kStaged on the host
// device, which runs this same code) every access goes through the device's streams: h2d and d2h
// copies between device memory and pinned host memory, kernels (cast, accumulate, fill) on the
// compute stream, and events between them; the host waits on an event before it reads what a
// stream wrote or reuses a buffer a stream reads. Collectives of device data take device memory
// directly when the Communicator does (NcclComm), else they are staged through pinned host
// buffers (d2h, the collective on the host, h2d).
//
// Everything here returns once its results are in place (gathered unit complete, gradient in its
// home), so the caller never sees stream work in flight. Three exceptions:
// - a prefetched unit's gather, queued ahead of use with one rank (gather.cpp, queue_gather);
// - a gradient homed in host memory or on NVMe, whose d2h is queued and whose host part runs at
//   the next reduce_grads or when the gradients are needed (reduce_grads.cpp, queue_grad_move);
// - the optimizer step: it stages sub-groups of device-homed state in and out of two pinned slots
//   while Adam runs, ordered by one event per slot and direction, and drains them at its end
//   (finish_staging); a sub-group whose every kind is homed on the device is instead updated in
//   place by the device's optimizer op on the compute stream (update_on_device), which the host
//   waits for before the step moves on.
#include <fmt/format.h>

#include <cstring>

#include "base/assert.hpp"
#include "cpu_adam/compressed_step.hpp"
#include "runtime/engine/engine_state.hpp"
#include "runtime/engine/trace.hpp"

namespace strata::runtime::detail {

DeviceLanes::DeviceLanes(tiers::Device& device)
    : h2d(device.create_stream()),
      d2h(device.create_stream()),
      compute(device.create_stream()),
      h2d_done(device.create_event()),
      d2h_done(device.create_event()),
      compute_done(device.create_event()),
      staged_in{device.create_event(), device.create_event()},
      staged_out{device.create_event(), device.create_event()},
      grad_moved{device.create_event(), device.create_event()} {}

void EngineState::copy_to_device(tiers::DeviceSpan dst, const void* host_src) {
  if (device_addressable_) {
    if (dst.bytes != 0) std::memcpy(dst.data, host_src, dst.bytes);
    return;
  }
  lanes_->h2d.copy_to_device(dst, host_src);
  lanes_->h2d.record(lanes_->h2d_done);
  lanes_->h2d_done.wait();
}

void EngineState::copy_to_host(void* host_dst, tiers::DeviceSpan src) {
  if (device_addressable_) {
    if (src.bytes != 0) std::memcpy(host_dst, src.data, src.bytes);
    return;
  }
  lanes_->d2h.copy_to_host(host_dst, src);
  lanes_->d2h.record(lanes_->d2h_done);
  lanes_->d2h_done.wait();
}

std::byte* EngineState::device_staging_at(Kind kind, std::size_t slot) const {
  STRATA_ASSERT(device_staging_, "no staging for device-homed state");
  STRATA_ASSERT(slot < 2);
  return device_staging_.data() + slot * plan_.device_staging_slot_bytes +
         plan_.device_staging_offsets[static_cast<std::size_t>(kind)];
}

void EngineState::stage_in(DeviceLanes* lanes, UnitState& unit, std::size_t group,
                           std::size_t slot, std::span<const Kind> kinds) {
  if (lanes == nullptr) return;
  // The slot's previous stage_out must have read it before it is refilled.
  lanes->d2h.wait(lanes->staged_out[slot]);
  // A sub-group the device updates in place stays where it is.
  const bool staged = !updates_on_device(unit);
  for (Kind kind : kinds) {
    if (!staged || !unit.has(kind) || unit.home(kind).residence() != Residence::kStagedDevice) {
      continue;
    }
    lanes->d2h.copy_to_host(device_staging_at(kind, slot), unit.home(kind).group_span(group));
  }
  // Recorded even with nothing copied: waiting on it also means the slot's stage_out is done, so
  // Adam may write the slot.
  lanes->d2h.record(lanes->staged_in[slot]);
}

void EngineState::wait_staged_in(DeviceLanes* lanes, std::size_t slot) {
  if (lanes != nullptr) lanes->staged_in[slot].wait();
}

void EngineState::stage_out(DeviceLanes* lanes, UnitState& unit, std::size_t group,
                            std::size_t slot, std::span<const Kind> kinds) {
  if (lanes == nullptr) return;
  const bool staged = !updates_on_device(unit);
  for (Kind kind : kinds) {
    if (!staged || !unit.has(kind) || unit.home(kind).residence() != Residence::kStagedDevice) {
      continue;
    }
    lanes->h2d.copy_to_device(unit.home(kind).group_span(group), device_staging_at(kind, slot));
  }
  lanes->h2d.record(lanes->staged_out[slot]);
}

bool EngineState::updates_on_device(const UnitState& unit) const {
  if (!lanes_ || options_.optimizer_compute != EngineOptions::OptimizerCompute::kRun) return false;
  for (const auto& kinds : {kUpdateReadKinds, kUpdateWriteKinds}) {
    for (Kind kind : kinds) {
      if (unit.has(kind) && unit.home(kind).residence() != Residence::kStagedDevice) return false;
    }
  }
  // A sub-group's weight-decay runs (at most one per tensor, and one for the padding) travel in
  // the gradient scratch; a unit of more tensors than its padded elements / 6 is staged instead.
  return (unit.spec.tensors.size() + 1) * sizeof(cpu_adam::DecayRun) <= grad_full_scratch_.bytes();
}

void EngineState::update_on_device(UnitState& unit, std::size_t group,
                                   const cpu_adam::Hyperparams& hyper,
                                   const cpu_adam::GradScaling& scaling) {
  const SubGroup& sub = unit.groups[group];
  Tracer::Scope scope(options_.tracer, TraceTrack::kOptimizer,
                      fmt::format("adam {} [{}]", unit.spec.name, group));
  const std::uint64_t first = unit.layout.shard_begin(rank_) + sub.begin;
  decay_runs_.clear();  // cut as update_compressed cuts them: bitwise the CPU's update
  if (hyper.weight_decay != 0) {
    for_each_decay_run(unit.spec, unit.layout, first, sub.numel, [&](const DecayRun& run) {
      decay_runs_.push_back({run.begin, run.numel, run.weight_decay});
    });
  }
  // update_compressed's rounding bits (a fp32 master draws none).
  const cpu_adam::StochasticRounding rounding{
      config_.run.seed ^ (0x9E3779B97F4A7C15ull * (unit_index(unit) + 1)), first};
  tiers::OptimizerOp op;
  op.plan = cpu_adam::plan_step(hyper, scaling, rounding);
  op.numel = sub.numel;
  op.master_dtype = unit.home(Kind::kMaster).state_dtype();
  op.master = unit.home(Kind::kMaster).group_span(group).data;
  if (unit.has(Kind::kCompensation)) {
    op.compensation = unit.home(Kind::kCompensation).group_span(group).data;
  }
  for (Kind kind : {Kind::kExpAvg, Kind::kExpAvgSq}) {
    if (!unit.has(kind)) continue;
    op.moment_dtype = unit.home(kind).state_dtype();
    (kind == Kind::kExpAvg ? op.exp_avg : op.exp_avg_sq) = unit.home(kind).group_span(group).data;
  }
  op.grad = unit.home(Kind::kGrad).group_span(group).data;
  op.grad_dtype = unit.home(Kind::kGrad).dtype;
  const bool params_apart = unit.has(Kind::kParam);  // else they are the master's own bytes
  if (param_dtype() != DType::kFp32 && params_apart) {
    op.param_out = unit.home(Kind::kParam).group_span(group).data;
    op.param_out_dtype = param_dtype();
  }
  tiers::Stream& compute = lanes_->compute;
  if (!decay_runs_.empty()) {
    const tiers::DeviceSpan runs =
        grad_full_scratch_.span(0, decay_runs_.size() * sizeof(cpu_adam::DecayRun));
    compute.copy_to_device(runs, decay_runs_.data());
    op.decay_runs = runs.as<const cpu_adam::DecayRun>();
    op.decay_run_count = decay_runs_.size();
  }
  compute.optimizer_update(op);
  if (param_dtype() == DType::kFp32 && params_apart) {  // update_sub_group's memcpy, convert
    const ShardHome& master = unit.home(Kind::kMaster);
    compute.cast(unit.home(Kind::kParam).group_span(group), DType::kFp32, master.group_span(group),
                 master.dtype);
  }
  // The host waits: decay_runs_ is refilled by the next sub-group, and whatever reads the new
  // state next (a gather the step starts, a checkpoint) may run on another stream.
  compute.record(lanes_->compute_done);
  lanes_->compute_done.wait();
  ++device_updated_groups_;
}

void EngineState::finish_staging(DeviceLanes* lanes) {
  if (lanes == nullptr) return;
  for (tiers::Event& event : lanes->staged_in) event.wait();
  for (tiers::Event& event : lanes->staged_out) event.wait();
}

void EngineState::all_gather_host(comm::ConstBuffer send, comm::MutableBuffer recv) {
  if (comm_->buffer_memory() == comm::BufferMemory::kHost) {
    comm_->all_gather(send, recv);
    return;
  }
  // NcclComm: through device memory. The gradient scratch is free outside reduce_grads and holds
  // a shard and a padded unit of fp32, which covers every caller but small scalar arrays.
  tiers::DeviceBuffer own_send;
  tiers::DeviceBuffer own_recv;
  tiers::DeviceSpan send_device = grad_shard_scratch_.span();
  tiers::DeviceSpan recv_device = grad_full_scratch_.span();
  if (send.bytes() > send_device.bytes || recv.bytes() > recv_device.bytes) {
    own_send = device_->allocate(send.bytes());
    own_recv = device_->allocate(recv.bytes());
    send_device = own_send.span();
    recv_device = own_recv.span();
  }
  send_device = send_device.subspan(0, send.bytes());
  recv_device = recv_device.subspan(0, recv.bytes());
  copy_to_device(send_device, send.data);
  comm_->all_gather(comm::ConstBuffer{send_device.data, send.count, send.dtype},
                   comm::MutableBuffer{recv_device.data, recv.count, recv.dtype});
  comm_->synchronize();
  copy_to_host(recv.data, recv_device);
}

}  // namespace strata::runtime::detail

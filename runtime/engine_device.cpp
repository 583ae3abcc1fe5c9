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
// home), so the caller never sees stream work in flight. The optimizer step is the exception: it
// stages sub-groups of device-homed state in and out of two pinned slots while Adam runs, ordered
// by one event per slot and direction, and drains them at its end (finish_staging).
#include <algorithm>
#include <cstring>

#include "base/assert.hpp"
#include "cpu_adam/cast.hpp"
#include "runtime/dtype_conversion.hpp"
#include "runtime/engine_state.hpp"

namespace strata::runtime::detail {

DeviceLanes::DeviceLanes(tiers::Device& device)
    : h2d(device.create_stream()),
      d2h(device.create_stream()),
      compute(device.create_stream()),
      h2d_done(device.create_event()),
      d2h_done(device.create_event()),
      compute_done(device.create_event()),
      staged_in{device.create_event(), device.create_event()},
      staged_out{device.create_event(), device.create_event()} {}

void EngineState::copy_to_device(tiers::DeviceSpan dst, const void* host_src) {
  if (device_addressable) {
    if (dst.bytes != 0) std::memcpy(dst.data, host_src, dst.bytes);
    return;
  }
  lanes->h2d.copy_to_device(dst, host_src);
  lanes->h2d.record(lanes->h2d_done);
  lanes->h2d_done.wait();
}

void EngineState::copy_to_host(void* host_dst, tiers::DeviceSpan src) {
  if (device_addressable) {
    if (src.bytes != 0) std::memcpy(host_dst, src.data, src.bytes);
    return;
  }
  lanes->d2h.copy_to_host(host_dst, src);
  lanes->d2h.record(lanes->d2h_done);
  lanes->d2h_done.wait();
}

std::byte* EngineState::device_staging_at(Kind kind, std::size_t slot) const {
  STRATA_ASSERT(device_staging, "no staging for device-homed state");
  STRATA_ASSERT(slot < 2);
  return device_staging.data() + slot * device_staging_slot_bytes +
         device_staging_offsets[static_cast<std::size_t>(kind)];
}

void EngineState::stage_in(UnitState& unit, std::size_t group, std::size_t slot,
                           std::span<const Kind> kinds) {
  if (!lanes) return;
  const SubGroup& sub = unit.groups[group];
  // The slot's previous stage_out must have read it before it is refilled.
  lanes->d2h.wait(lanes->staged_out[slot]);
  for (Kind kind : kinds) {
    if (!unit.has(kind) || !unit.home(kind).staged_on_device()) continue;
    lanes->d2h.copy_to_host(device_staging_at(kind, slot),
                            unit.home(kind).device_span(sub.begin, sub.numel));
  }
  // Recorded even with nothing copied: waiting on it also means the slot's stage_out is done, so
  // Adam may write the slot.
  lanes->d2h.record(lanes->staged_in[slot]);
}

void EngineState::wait_staged_in(std::size_t slot) {
  if (lanes) lanes->staged_in[slot].wait();
}

void EngineState::stage_out(UnitState& unit, std::size_t group, std::size_t slot,
                            std::span<const Kind> kinds) {
  if (!lanes) return;
  const SubGroup& sub = unit.groups[group];
  for (Kind kind : kinds) {
    if (!unit.has(kind) || !unit.home(kind).staged_on_device()) continue;
    lanes->h2d.copy_to_device(unit.home(kind).device_span(sub.begin, sub.numel),
                              device_staging_at(kind, slot));
  }
  lanes->h2d.record(lanes->staged_out[slot]);
}

void EngineState::finish_staging() {
  if (!lanes) return;
  for (tiers::Event& event : lanes->staged_in) event.wait();
  for (tiers::Event& event : lanes->staged_out) event.wait();
}

void EngineState::all_gather_host(comm::ConstBuffer send, comm::MutableBuffer recv) {
  if (comm->buffer_memory() == comm::BufferMemory::kHost) {
    comm->all_gather(send, recv);
    return;
  }
  // NcclComm: through device memory. The gradient scratch is free outside reduce_grads and holds
  // a shard and a padded unit of fp32, which covers every caller but small scalar arrays.
  tiers::DeviceBuffer own_send;
  tiers::DeviceBuffer own_recv;
  tiers::DeviceSpan send_device = grad_shard_scratch.span();
  tiers::DeviceSpan recv_device = grad_full_scratch.span();
  if (send.bytes() > send_device.bytes || recv.bytes() > recv_device.bytes) {
    own_send = device->allocate(send.bytes());
    own_recv = device->allocate(recv.bytes());
    send_device = own_send.span();
    recv_device = own_recv.span();
  }
  send_device = send_device.subspan(0, send.bytes());
  recv_device = recv_device.subspan(0, recv.bytes());
  copy_to_device(send_device, send.data);
  comm->all_gather(comm::ConstBuffer{send_device.data, send.count, send.dtype},
                   comm::MutableBuffer{recv_device.data, recv.count, recv.dtype});
  comm->synchronize();
  copy_to_host(recv.data, recv_device);
}

void EngineState::finish_gather(UnitState& unit) {
  ShardHome& param = unit.home(Kind::kParam16);
  const UnitLayout& layout = unit.layout;
  const std::uint64_t element_bytes = param.element_bytes();
  const std::uint64_t shard_bytes = layout.shard_numel * element_bytes;
  const std::uint64_t padded_bytes = layout.padded_numel * element_bytes;
  tiers::DeviceBuffer& gathered = param_dtype == cpu_adam::Dtype::kFp32 ? unit.full32 : unit.full16;
  const std::uint64_t own_offset = layout.shard_begin(rank) * element_bytes;
  const comm::DataType wire = to_comm_dtype(param_dtype);

  if (device_addressable) {
    std::byte* own = gathered.data() + own_offset;
    if (param.tier != Tier::kNvme) std::memcpy(own, param.memory, shard_bytes);
    if (ranks > 1) {
      std::memcpy(gather_send_scratch.data(), own, shard_bytes);
      comm->all_gather(comm::ConstBuffer{gather_send_scratch.data(), layout.shard_numel, wire},
                       comm::MutableBuffer{gathered.data(), layout.padded_numel, wire});
    }
    if (param_dtype != cpu_adam::Dtype::kFp32) {
      cpu_adam::convert(
          cpu_adam::ConstTypedSpan(unit.full16.data(), layout.padded_numel, param_dtype),
          cpu_adam::TypedSpan(unit.full32.data(), layout.padded_numel, cpu_adam::Dtype::kFp32),
          *arena);
    }
    return;
  }

  // Staged: the own shard comes from pinned host memory (host home, or the NVMe reads' staging)
  // or from device memory (device home).
  DeviceLanes& lane = *lanes;
  const std::byte* host_own = param.tier == Tier::kHost   ? param.memory
                              : param.tier == Tier::kNvme ? unit.param_staging()
                                                          : nullptr;
  if (ranks > 1 && !comm_on_device) {
    // The collective runs on the host: own shard into pinned memory, all-gather into pinned
    // memory, one copy of the whole unit to the device.
    std::byte* send = shard_staging.data();
    if (host_own != nullptr) {
      std::memcpy(send, host_own, shard_bytes);
    } else {
      copy_to_host(send, param.device_span(0, layout.shard_numel));
    }
    comm->all_gather(comm::ConstBuffer{send, layout.shard_numel, wire},
                     comm::MutableBuffer{full_staging.data(), layout.padded_numel, wire});
    lane.h2d.copy_to_device(gathered.span(0, padded_bytes), full_staging.data());
  } else {
    const tiers::DeviceSpan own = gathered.span(own_offset, shard_bytes);
    if (host_own != nullptr) {
      lane.h2d.copy_to_device(own, host_own);
    } else {
      lane.h2d.copy_on_device(own, param.device_span(0, layout.shard_numel));
    }
    if (ranks > 1) {  // NcclComm: in device memory, on the communicator's stream
      lane.h2d.copy_on_device(gather_send_scratch.span(0, shard_bytes), own);
      lane.h2d.record(lane.h2d_done);
      lane.h2d_done.wait();
      comm->all_gather(comm::ConstBuffer{gather_send_scratch.data(), layout.shard_numel, wire},
                       comm::MutableBuffer{gathered.data(), layout.padded_numel, wire});
      comm->synchronize();
    }
  }
  lane.h2d.record(lane.h2d_done);
  lane.compute.wait(lane.h2d_done);
  if (param_dtype != cpu_adam::Dtype::kFp32) {
    lane.compute.cast(unit.full32.span(0, layout.padded_numel * 4), tiers::DType::kFloat32,
                      unit.full16.span(0, padded_bytes), to_device_dtype(param_dtype));
  }
  lane.compute.record(lane.compute_done);
  lane.compute_done.wait();
  unit.release_param_staging();  // the h2d copy that read it is done (compute waited for it)
}

void EngineState::reduce_grads(UnitState& unit, std::span<const float> full_grads) {
  const UnitLayout& layout = unit.layout;
  ShardHome& home = unit.home(Kind::kGrad);
  const bool accumulate = unit.grad_calls > 0;
  const bool last = unit.grad_calls + 1 == options.grad_accumulation;
  ++unit.grad_calls;

  // 1. The reduced fp32 shard: in host memory (`host_shard`) or device memory (`device_shard`).
  const float* host_shard = nullptr;
  tiers::DeviceSpan device_shard;
  if (device_addressable) {
    auto* full = reinterpret_cast<float*>(grad_full_scratch.data());
    auto* shard = reinterpret_cast<float*>(grad_shard_scratch.data());
    std::memcpy(full, full_grads.data(), full_grads.size_bytes());
    std::fill(full + layout.numel, full + layout.padded_numel, 0.0f);
    if (ranks > 1) {
      comm->reduce_scatter(std::span<const float>(full, layout.padded_numel),
                           std::span<float>(shard, layout.shard_numel), comm::ReduceOp::kAvg);
    } else {
      shard = full;
    }
    host_shard = shard;
  } else {
    DeviceLanes& lane = *lanes;
    const tiers::DeviceSpan full = grad_full_scratch.span(0, layout.padded_numel * 4);
    // The caller's gradient is complete and in device memory; padding is zero.
    lane.compute.copy_on_device(
        full.subspan(0, full_grads.size_bytes()),
        tiers::DeviceSpan{reinterpret_cast<std::byte*>(const_cast<float*>(full_grads.data())),
                          full_grads.size_bytes()});
    lane.compute.fill(full.subspan(full_grads.size_bytes(), full.bytes - full_grads.size_bytes()),
                      0.0f);
    lane.compute.record(lane.compute_done);
    if (ranks == 1) {
      device_shard = full;
    } else if (comm_on_device) {
      lane.compute_done.wait();
      device_shard = grad_shard_scratch.span(0, layout.shard_numel * 4);
      comm->reduce_scatter(
          comm::ConstBuffer{full.data, layout.padded_numel, comm::DataType::kFp32},
          comm::MutableBuffer{device_shard.data, layout.shard_numel, comm::DataType::kFp32},
          comm::ReduceOp::kAvg);
      comm->synchronize();
    } else {
      lane.d2h.wait(lane.compute_done);
      lane.d2h.copy_to_host(full_staging.data(), full);
      lane.d2h.record(lane.d2h_done);
      lane.d2h_done.wait();
      auto* shard = reinterpret_cast<float*>(shard_staging.data());
      comm->reduce_scatter(
          std::span<const float>(reinterpret_cast<const float*>(full_staging.data()),
                                 layout.padded_numel),
          std::span<float>(shard, layout.shard_numel), comm::ReduceOp::kAvg);
      host_shard = shard;
    }
  }

  // 2. Into its home. Device-homed (staged): converted or accumulated by a kernel, then read back
  // for the global norm when it is the micro-batch that completes the gradient.
  if (home.staged_on_device()) {
    DeviceLanes& lane = *lanes;
    if (host_shard != nullptr) {
      device_shard = grad_shard_scratch.span(0, layout.shard_numel * 4);
      lane.h2d.copy_to_device(device_shard, host_shard);
      lane.h2d.record(lane.h2d_done);
      lane.compute.wait(lane.h2d_done);
    }
    const tiers::DeviceSpan stored = home.device_span(0, home.numel);
    if (accumulate) {  // fp32 storage when accumulating
      lane.compute.accumulate(stored, device_shard, tiers::DType::kFloat32);
    } else {
      lane.compute.cast(stored, to_device_dtype(home.dtype), device_shard, tiers::DType::kFloat32);
    }
    lane.compute.record(lane.compute_done);
    if (!last) {
      lane.compute_done.wait();
      return;
    }
    lane.d2h.wait(lane.compute_done);
    lane.d2h.copy_to_host(shard_staging.data(), stored);
    lane.d2h.record(lane.d2h_done);
    lane.d2h_done.wait();
    norm.add(cpu_adam::ConstTypedSpan(shard_staging.data(), home.numel, home.dtype), *arena);
    return;
  }
  if (host_shard == nullptr) {
    lanes->d2h.wait(lanes->compute_done);  // the shard was written on the compute stream
    copy_to_host(shard_staging.data(), device_shard.subspan(0, layout.shard_numel * 4));
    host_shard = reinterpret_cast<const float*>(shard_staging.data());
  }

  // Host memory (or device memory the CPU addresses).
  if (home.memory != nullptr) {
    if (accumulate) {  // fp32 storage when accumulating
      auto* stored = reinterpret_cast<float*>(home.memory);
      for (std::uint64_t i = 0; i < layout.shard_numel; ++i) stored[i] += host_shard[i];
    } else {
      cpu_adam::convert(std::span<const float>(host_shard, layout.shard_numel),
                        cpu_adam::TypedSpan(home.memory, home.numel, home.dtype), *arena);
    }
    if (last) norm.add(cpu_adam::ConstTypedSpan(home.memory, home.numel, home.dtype), *arena);
    return;
  }
  // NVMe: through a pinned staging buffer (two, alternating, so one can be written while the next
  // unit's gradient is prepared).
  const std::size_t index = next_grad_buffer;
  next_grad_buffer = 1 - next_grad_buffer;
  for (io::Ticket& ticket : grad_buffer_writes[index]) wait_timed(ticket);
  grad_buffer_writes[index].clear();
  std::byte* staging = grad_buffers[index].data();
  if (accumulate) {
    for (std::size_t g = 0; g < unit.groups.size(); ++g) {
      const SubGroup& sub = unit.groups[g];
      tiers::StoreRead read =
          store->read(home.extents[g], std::span(staging + sub.begin * 4, sub.numel * 4));
      wait_timed(read);
    }
    auto* stored = reinterpret_cast<float*>(staging);
    for (std::uint64_t i = 0; i < layout.shard_numel; ++i) stored[i] += host_shard[i];
  } else {
    cpu_adam::convert(std::span<const float>(host_shard, layout.shard_numel),
                      cpu_adam::TypedSpan(staging, home.numel, home.dtype), *arena);
  }
  if (last) norm.add(cpu_adam::ConstTypedSpan(staging, home.numel, home.dtype), *arena);
  for (std::size_t g = 0; g < unit.groups.size(); ++g) {
    const SubGroup& sub = unit.groups[g];
    const std::uint64_t element_bytes = home.element_bytes();
    grad_buffer_writes[index].push_back(store->write(
        home.extents[g], std::span<const std::byte>(staging + sub.begin * element_bytes,
                                                    sub.numel * element_bytes)));
  }
}

}  // namespace strata::runtime::detail

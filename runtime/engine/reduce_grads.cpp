// Gradient reduction: a unit's full fp32 gradient is reduce-scattered (averaged over the ranks)
// into this rank's shard, which goes to the gradient's home, converted to its type or, from the
// second micro-batch on, added in fp32. The reduce-scatter moves [precision] reduce_dtype
// (gradient_reduce_dtype, config.hpp): in a 16-bit dtype each rank rounds its full gradient to it
// first, the ranks' values are added in fp32 in rank order and the average rounded once (comm/
// reduction.hpp), half the bytes of an fp32 reduce-scatter; the shard is widened back to fp32 (exact)
// for the code below. The micro-batch that completes the gradient adds its
// squares to the global-norm accumulator the optimizer step reads (on the staged path with every
// gradient homed on the device, to a device double read back once per step). On the staged path
// (a CUDA device) a gradient homed in host memory or on NVMe leaves the device on the d2h stream
// while the caller computes the next one: queue_grad_move, finish_grad_moves.
//
// Contracts of step() (checked by check_step_contracts, before anything changes): no GatheredUnit
// alive (its view would silently keep the pre-step weights), and every unit given exactly
// grad_accumulation reduce_grads calls since the last step (a unit without them would be updated
// with a stale gradient, and a partial one would be left out of the clip norm).
#include <algorithm>
#include <bit>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

#include "base/assert.hpp"
#include "base/float16.hpp"
#include "cpu_adam/cast.hpp"
#include "runtime/engine/engine_state.hpp"

namespace strata::runtime::detail {
namespace {

constexpr std::size_t kConvertBlock = 4096;

// data[0, count) fp32 -> the same bytes' first count * 2 as `to` (bf16 or fp16), round to nearest
// even. In place, front to back through a block copy: block b's 16-bit bytes overlap only fp32
// values already read.
void narrow_in_place(std::byte* data, std::size_t count, DType to) {
  float block[kConvertBlock];
  for (std::size_t begin = 0; begin < count; begin += kConvertBlock) {
    const std::size_t n = std::min(kConvertBlock, count - begin);
    std::memcpy(block, data + begin * 4, n * 4);
    std::byte* out = data + begin * 2;
    if (to == DType::kBf16) {
      for (std::size_t i = 0; i < n; ++i) {
        const Bf16 value = to_bf16(block[i]);
        std::memcpy(out + i * 2, &value, 2);
      }
    } else {
      for (std::size_t i = 0; i < n; ++i) {
        const Fp16 value = to_fp16(block[i]);
        std::memcpy(out + i * 2, &value, 2);
      }
    }
  }
}

// The reverse: count 16-bit values of `from` at the front of data -> count fp32 values, exact.
// Back to front: block b's fp32 bytes overlap only 16-bit values of b and later blocks.
void widen_in_place(std::byte* data, std::size_t count, DType from) {
  std::uint16_t block[kConvertBlock];
  for (std::size_t end = count; end > 0;) {
    const std::size_t n = std::min(kConvertBlock, end);
    const std::size_t begin = end - n;
    std::memcpy(block, data + begin * 2, n * 2);
    auto* out = reinterpret_cast<float*>(data) + begin;
    if (from == DType::kBf16) {
      for (std::size_t i = 0; i < n; ++i) out[i] = to_float(std::bit_cast<Bf16>(block[i]));
    } else {
      for (std::size_t i = 0; i < n; ++i) out[i] = to_float(std::bit_cast<Fp16>(block[i]));
    }
    end = begin;
  }
}

}  // namespace

// Host memory: `full` (padded fp32 values) reduce-scattered into `shard` (room for shard_numel
// fp32), which holds the fp32 result on return. In a 16-bit reduce dtype `full` is overwritten.
void EngineState::reduce_scatter_on_host(const UnitLayout& layout, std::byte* full,
                                         std::byte* shard) {
  if (reduce_dtype_ == DType::kFp32) {
    comm_->reduce_scatter(
        std::span<const float>(reinterpret_cast<const float*>(full), layout.padded_numel),
        std::span<float>(reinterpret_cast<float*>(shard), layout.shard_numel), comm::ReduceOp::kAvg);
    return;
  }
  narrow_in_place(full, layout.padded_numel, reduce_dtype_);
  comm_->reduce_scatter(comm::ConstBuffer{full, layout.padded_numel, reduce_dtype_},
                        comm::MutableBuffer{shard, layout.shard_numel, reduce_dtype_},
                        comm::ReduceOp::kAvg);
  widen_in_place(shard, layout.shard_numel, reduce_dtype_);
}

void EngineState::reduce_grads(UnitId id, std::span<const float> full_grads) {
  STRATA_ASSERT(finalized_, "reduce_grads before finalize");
  this->unit(id);  // throws std::out_of_range naming an unknown id
  complete_deferred();  // the last step must be done with this unit's gradient home
  UnitState& unit = units_[id];
  if (full_grads.size() != unit.layout.numel) {
    throw std::invalid_argument(
        fmt::format("reduce_grads('{}'): {} gradient values, the unit has {}", unit.spec.name,
                    full_grads.size(), unit.layout.numel));
  }
  if (unit.grad_calls >= options_.grad_accumulation) {
    throw std::logic_error(
        fmt::format("reduce_grads('{}') called {} times in one step; grad_accumulation is {}",
                    unit.spec.name, unit.grad_calls + 1, options_.grad_accumulation));
  }
  // The step's first gradient: the state reads of its first sub-groups may start now.
  if (!pre_reads_tried_) start_pre_reads();
  Tracer::Scope scope(options_.tracer, TraceTrack::kCopies, "reduce_grads " + unit.spec.name);
  const bool accumulate = unit.grad_calls > 0;
  const bool last = unit.grad_calls + 1 == options_.grad_accumulation;
  ++unit.grad_calls;
  if (queues_grad_moves(unit)) {
    queue_grad_move(unit, full_grads, accumulate, last);
    return;
  }
  finish_grad_moves();  // gradients are stored, and the norm summed, in the order of the calls
  tiers::DeviceSpan device_shard;
  const float* host_shard = reduce_to_shard(unit, full_grads, device_shard);
  if (unit.home(Kind::kGrad).residence() == Residence::kStagedDevice) {
    store_grad_on_device(unit, host_shard, device_shard, accumulate, last);
    return;
  }
  if (host_shard == nullptr) {
    lanes_->d2h.wait(lanes_->compute_done);  // the shard was written on the compute stream
    copy_to_host(shard_staging_.data(), device_shard.subspan(0, unit.layout.shard_numel * 4));
    host_shard = reinterpret_cast<const float*>(shard_staging_.data());
  }
  store_grad_in_host(unit, host_shard, accumulate, last);
  if (last) speculate(id);  // the unit's update may start while the backward goes on
}

// Homed on the device, nothing leaves it: the norm is summed there (store_grad_on_device).
bool EngineState::queues_grad_moves(const UnitState& unit) const {
  return grad_moves_.enabled() && unit.home(Kind::kGrad).residence() != Residence::kStagedDevice;
}

// The caller's gradient into the device scratch (padded with zeros), then a copy of the whole
// padded unit into a pinned slot on the d2h stream, ordered by events; the host waits only for the
// device-side copy out of the caller's buffer, which the caller may reuse on return. The previous
// call's move is finished here: its copy ran while the caller computed this unit's gradient.
void EngineState::queue_grad_move(UnitState& unit, std::span<const float> full_grads,
                                  bool accumulate, bool last) {
  DeviceLanes& lane = *lanes_;
  const UnitLayout& layout = unit.layout;
  const std::size_t slot = grad_moves_.next_slot();
  // The scratch is free once the move queued before this one has copied it out.
  if (!grad_moves_.empty()) lane.compute.wait(lane.grad_moved[1 - slot]);
  const tiers::DeviceSpan full = copy_to_grad_scratch(layout, full_grads);
  push_grad_move(full,
                 GradMoves::Move{static_cast<UnitId>(unit_index(unit)), slot, accumulate, last});
  lane.compute_done.wait();  // out of the caller's buffer
  finish_grad_moves(/*keep=*/1);
  STRATA_ASSERT(grad_moves_.in_flight() == 1, "the move just queued is the one left in flight");
}

// The caller's gradient into the padded device scratch (padding zero) on the compute stream,
// compute_done recorded after it.
tiers::DeviceSpan EngineState::copy_to_grad_scratch(const UnitLayout& layout,
                                                    std::span<const float> full_grads) {
  DeviceLanes& lane = *lanes_;
  const tiers::DeviceSpan full = grad_full_scratch_.span(0, layout.padded_numel * 4);
  lane.compute.copy_on_device(
      full.subspan(0, full_grads.size_bytes()),
      tiers::DeviceSpan{reinterpret_cast<std::byte*>(const_cast<float*>(full_grads.data())),
                        full_grads.size_bytes()});
  lane.compute.fill(full.subspan(full_grads.size_bytes(), full.bytes - full_grads.size_bytes()),
                    0.0f);
  lane.compute.record(lane.compute_done);
  return full;
}

// A d2h of `source` (after the compute stream's work so far) into the move's slot, queued.
void EngineState::push_grad_move(tiers::DeviceSpan source, const GradMoves::Move& move) {
  DeviceLanes& lane = *lanes_;
  STRATA_ASSERT(move.slot == grad_moves_.next_slot() && grad_moves_.in_flight() < GradMoves::kSlots,
                "a gradient slot still in use");
  lane.d2h.wait(lane.compute_done);
  lane.d2h.copy_to_host(grad_moves_.slot(move.slot), source);
  lane.d2h.record(lane.grad_moved[move.slot]);
  grad_moves_.push(move);
}

void EngineState::finish_grad_moves(std::size_t keep) {
  while (grad_moves_.in_flight() > keep) {
    const GradMoves::Move move = grad_moves_.pop_oldest();  // one that fails is not retried
    UnitState& unit = units_[move.unit];
    Tracer::Scope scope(options_.tracer, TraceTrack::kCopies, "gradient to host " + unit.spec.name);
    lanes_->grad_moved[move.slot].wait();
    std::byte* moved = grad_moves_.slot(move.slot);
    const float* shard = reinterpret_cast<const float*>(moved);
    if (ranks_ > 1) {
      reduce_scatter_on_host(unit.layout, moved, shard_staging_.data());
      shard = reinterpret_cast<const float*>(shard_staging_.data());
    }
    store_grad_in_host(unit, shard, move.accumulate, move.last);
    if (move.last) speculate(move.unit);
  }
}

void EngineState::discard_grad_moves() noexcept {
  grad_moves_.drop_all([&](const GradMoves::Move& move) {
    try {
      lanes_->grad_moved[move.slot].wait();
    } catch (...) {  // the copy failed; nothing is stored either way
    }
  });
}

// The reduced fp32 shard: returned when it is in host memory, else left in `device_shard`.
const float* EngineState::reduce_to_shard(UnitState& unit, std::span<const float> full_grads,
                                          tiers::DeviceSpan& device_shard) {
  const UnitLayout& layout = unit.layout;
  if (device_addressable_) {
    auto* full = reinterpret_cast<float*>(grad_full_scratch_.data());
    auto* shard = reinterpret_cast<float*>(grad_shard_scratch_.data());
    std::memcpy(full, full_grads.data(), full_grads.size_bytes());
    std::fill(full + layout.numel, full + layout.padded_numel, 0.0f);
    if (ranks_ == 1) return full;
    reduce_scatter_on_host(layout, grad_full_scratch_.data(), grad_shard_scratch_.data());
    return shard;
  }
  DeviceLanes& lane = *lanes_;
  if (plan_.grads_to_home) {  // one rank, its home on the device: read where the caller wrote it
    device_shard = tiers::DeviceSpan{
        reinterpret_cast<std::byte*>(const_cast<float*>(full_grads.data())), full_grads.size_bytes()};
    return nullptr;
  }
  // The caller's gradient is complete and in device memory; padding is zero.
  const tiers::DeviceSpan full = copy_to_grad_scratch(layout, full_grads);
  if (ranks_ == 1) {
    device_shard = full;
    return nullptr;
  }
  if (comm_on_device_) {  // NcclComm: fp32 (reduce_dtype_ is fp32, engine_setup.cpp)
    lane.compute_done.wait();
    device_shard = grad_shard_scratch_.span(0, layout.shard_numel * 4);
    comm_->reduce_scatter(
        comm::ConstBuffer{full.data, layout.padded_numel, DType::kFp32},
        comm::MutableBuffer{device_shard.data, layout.shard_numel, DType::kFp32},
        comm::ReduceOp::kAvg);
    comm_->synchronize();
    return nullptr;
  }
  lane.d2h.wait(lane.compute_done);
  lane.d2h.copy_to_host(full_staging_.data(), full);
  lane.d2h.record(lane.d2h_done);
  lane.d2h_done.wait();
  reduce_scatter_on_host(layout, full_staging_.data(), shard_staging_.data());
  return reinterpret_cast<const float*>(shard_staging_.data());
}

// Device-homed (staged): converted or accumulated by a kernel; the micro-batch that completes the
// gradient adds its sum of squares to the device's running norm.
void EngineState::store_grad_on_device(UnitState& unit, const float* host_shard,
                                       tiers::DeviceSpan device_shard, bool accumulate, bool last) {
  DeviceLanes& lane = *lanes_;
  const ShardHome& home = unit.home(Kind::kGrad);
  if (host_shard != nullptr) {
    device_shard = grad_shard_scratch_.span(0, unit.layout.shard_numel * 4);
    lane.h2d.copy_to_device(device_shard, host_shard);
    lane.h2d.record(lane.h2d_done);
    lane.compute.wait(lane.h2d_done);
  }
  // Read from the caller's buffer (grads_to_home), the cast is waited for before returning: the
  // caller may reuse it then.
  const bool queue = plan_.grad_stores_queued && !plan_.grads_to_home;
  if (queue) {
    // What the caller and the next call reuse is free: the caller's buffer, copied into the
    // scratch on the compute stream (one rank) or read by the d2h reduce_to_shard waited for, and
    // the pinned shard the h2d reads. The cast and the norm run on.
    if (host_shard != nullptr) {
      lane.h2d_done.wait();
    } else {
      lane.compute_done.wait();
    }
  }
  const tiers::DeviceSpan stored = home.device_span(0, home.numel);
  // The unit's elements; past them (the caller's gradient without the shard's padding) zeros.
  const std::uint64_t given = device_shard.bytes / 4;
  STRATA_ASSERT(given <= home.numel, "a gradient longer than its shard");
  const tiers::DeviceSpan values = home.device_span(0, given);
  if (accumulate) {  // fp32 storage when accumulating
    lane.compute.accumulate(values, device_shard, DType::kFp32);
  } else {
    lane.compute.cast(values, home.dtype, device_shard, DType::kFp32);
  }
  if (given < home.numel) {
    const std::uint64_t bytes = home.element_bytes();
    lane.compute.fill_bytes(stored.subspan(given * bytes, (home.numel - given) * bytes), 0);
  }
  // The gradient is complete: its sum of squares joins the norm's, on the device, in call order
  // (global_sum_of_squares reads the total back once).
  if (last) {
    STRATA_ASSERT(norm_device_sum_, "a device-homed gradient's norm is summed on the device");
    lane.compute.sum_of_squares(stored, home.dtype, norm_device_sum_.span(),
                                norm_device_scratch_.span());
  }
  lane.compute.record(lane.compute_done);
  if (!queue) lane.compute_done.wait();
}

// Addressable memory in place; NVMe through a pinned staging buffer (two, alternating, so one is
// written while the next unit's gradient is prepared), read back first when accumulating.
void EngineState::store_grad_in_host(UnitState& unit, const float* host_shard, bool accumulate,
                                     bool last) {
  const ShardHome& home = unit.home(Kind::kGrad);
  const bool on_nvme = home.residence() == Residence::kNvme;
  const std::size_t index = next_grad_buffer_;
  std::byte* stored = home.memory;
  if (on_nvme) {
    next_grad_buffer_ = 1 - next_grad_buffer_;
    for (io::Ticket& ticket : grad_buffer_writes_[index]) wait_timed(ticket);
    grad_buffer_writes_[index].clear();
    stored = grad_buffers_[index].data();
  }
  const std::uint64_t element_bytes = home.element_bytes();
  if (accumulate) {  // fp32 storage when accumulating
    for (std::size_t g = 0; on_nvme && g < unit.groups.size(); ++g) {
      fill(unit, Kind::kGrad, g, stored + unit.groups[g].begin * element_bytes);
    }
    auto* values = reinterpret_cast<float*>(stored);
    for (std::uint64_t i = 0; i < unit.layout.shard_numel; ++i) values[i] += host_shard[i];
  } else {
    cpu_adam::convert(std::span<const float>(host_shard, unit.layout.shard_numel),
                      cpu_adam::TypedSpan(stored, home.numel, home.dtype), *arena_);
  }
  if (last) norm_.add(cpu_adam::ConstTypedSpan(stored, home.numel, home.dtype), *arena_);
  // Gradient buffer b follows the pipeline buffers among the engine's fixed buffers.
  const std::optional<std::uint32_t> fixed =
      on_nvme && !io_engine_->options().fixed_buffers.empty()
          ? std::optional(static_cast<std::uint32_t>(pipeline_buffers_.size() + index))
          : std::nullopt;
  for (std::size_t g = 0; on_nvme && g < unit.groups.size(); ++g) {
    const SubGroup& sub = unit.groups[g];
    const std::lock_guard lock(store_mutex_);
    grad_buffer_writes_[index].push_back(store_->write(
        home.extents[g],
        std::span<const std::byte>(stored + sub.begin * element_bytes, sub.numel * element_bytes),
        fixed));
  }
}

void EngineState::check_step_contracts() const {
  for (const UnitState& unit : units_) {
    if (unit.gathered.live_handles > 0) {
      throw std::logic_error(fmt::format(
          "step() while unit '{}' is gathered ({} GatheredUnit handle(s) alive): destroy every "
          "GatheredUnit before step(), or its view keeps the weights from before the update",
          unit.spec.name, unit.gathered.live_handles));
    }
  }
  for (const UnitState& unit : units_) {
    if (unit.grad_calls != options_.grad_accumulation) {
      throw std::logic_error(fmt::format(
          "step(): unit '{}' got {} reduce_grads call(s) since the last step; it needs {} "
          "(EngineOptions::grad_accumulation): every unit's gradient must be complete before "
          "step()",
          unit.spec.name, unit.grad_calls, options_.grad_accumulation));
    }
  }
}

}  // namespace strata::runtime::detail

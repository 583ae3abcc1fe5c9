// Moving one sub-group of a shard between its home and bytes the CPU works on. window() says where
// the CPU finds the sub-group (in place, or in staging the caller lends), fill() brings the home's
// bytes there and flush() takes them back; all three switch on ShardHome::residence(), the only
// place the tiers are told apart. The synchronous read_group / write_group serve everything
// outside the optimizer step (initialisation, resume, checkpoints, tests); the step and the
// gradient path use window() with their own staging and issue NVMe I/O asynchronously.
#include <algorithm>
#include <cstring>

#include "base/assert.hpp"
#include "cpu_adam/cast.hpp"
#include "cpu_adam/state_format.hpp"
#include "runtime/engine/engine_state.hpp"
#include "runtime/engine/trace.hpp"

namespace strata::runtime::detail {
namespace {

// The int8 code of a quantized kind: signed for exp_avg, non-negative for exp_avg_sq.
cpu_adam::MomentKind moment_of(Kind kind) {
  return kind == Kind::kExpAvgSq ? cpu_adam::MomentKind::kExpAvgSq : cpu_adam::MomentKind::kExpAvg;
}

}  // namespace

std::byte* EngineState::window(UnitState& unit, Kind kind, std::size_t group,
                               const GroupStaging& staging) {
  STRATA_ASSERT(group < unit.groups.size() && unit.has(kind), "a window on no sub-group");
  const ShardHome& home = unit.home(kind);
  switch (home.residence()) {
    case Residence::kAddressable:
      return home.group_at(group);
    case Residence::kStagedDevice:
      STRATA_ASSERT(staging.device != nullptr, "no device staging lent");
      return staging.device;
    case Residence::kNvme:
      STRATA_ASSERT(staging.nvme != nullptr, "no NVMe staging lent");
      return staging.nvme;
  }
  return nullptr;
}

void EngineState::fill(UnitState& unit, Kind kind, std::size_t group, std::byte* window) {
  STRATA_ASSERT(group < unit.groups.size() && window != nullptr,
                "a fill of no sub-group or window");
  ShardHome& home = unit.home(kind);
  const SubGroup& sub = unit.groups[group];
  switch (home.residence()) {
    case Residence::kAddressable:
      return;  // the window is the home
    case Residence::kStagedDevice:
      copy_to_host(window, home.group_span(group));
      return;
    case Residence::kNvme: {
      tiers::StoreRead read;
      {
        const std::lock_guard lock(store_mutex_);
        read = store_->read(home.extents[group], std::span(window, home.bytes(sub.numel)));
      }
      wait_timed(read);
      return;
    }
  }
}

void EngineState::flush(UnitState& unit, Kind kind, std::size_t group, const std::byte* window) {
  STRATA_ASSERT(group < unit.groups.size() && window != nullptr,
                "a flush of no sub-group or window");
  ShardHome& home = unit.home(kind);
  const SubGroup& sub = unit.groups[group];
  switch (home.residence()) {
    case Residence::kAddressable:
      return;
    case Residence::kStagedDevice:
      copy_to_device(home.group_span(group), window);
      return;
    case Residence::kNvme: {
      io::Ticket written;
      {
        const std::lock_guard lock(store_mutex_);
        written = store_->write(home.extents[group], std::span(window, home.bytes(sub.numel)));
      }
      wait_timed(written);
      return;
    }
  }
}

// Outside the optimizer step the first slot of the device staging and the first pipeline buffer
// are free: no allocation beyond the budget the plan checked (each holds a sub-group of every kind
// homed there, so one kind fits).
GroupStaging EngineState::staging_outside_step(Kind kind) const {
  GroupStaging staging;
  if (device_staging_) staging.device = device_staging_at(kind, 0);
  if (!pipeline_buffers_.empty()) staging.nvme = pipeline_buffers_.front().data();
  return staging;
}

void EngineState::read_group(UnitState& unit, Kind kind, std::size_t group,
                             std::span<std::byte> out) {
  STRATA_ASSERT(out.size() == unit.home(kind).bytes(unit.groups[group].numel),
                "group size mismatch");
  std::byte* bytes = window(unit, kind, group, staging_outside_step(kind));
  STRATA_ASSERT(bytes != nullptr, "no window for the sub-group");
  fill(unit, kind, group, bytes);
  std::memcpy(out.data(), bytes, out.size());
}

void EngineState::write_group(UnitState& unit, Kind kind, std::size_t group,
                              std::span<const std::byte> data) {
  STRATA_ASSERT(data.size() == unit.home(kind).bytes(unit.groups[group].numel),
                "group size mismatch");
  std::byte* bytes = window(unit, kind, group, staging_outside_step(kind));
  STRATA_ASSERT(bytes != nullptr, "no window for the sub-group");
  std::memcpy(bytes, data.data(), data.size());
  flush(unit, kind, group, bytes);
}

std::vector<float> EngineState::read_shard_fp32(UnitId id, Kind kind) {
  const UnitState& unit = units_.at(id);
  std::vector<float> out(unit.home(kind).numel);
  for (std::size_t g = 0; g < unit.groups.size(); ++g) {
    const SubGroup& sub = unit.groups[g];
    STRATA_ASSERT(sub.begin + sub.numel <= out.size(), "a sub-group past its shard");
    read_group_fp32(id, kind, g, std::span<float>(out).subspan(sub.begin, sub.numel));
  }
  return out;
}

void EngineState::write_shard(UnitId id, Kind kind, std::span<const float> values) {
  const UnitState& unit = units_.at(id);
  if (!unit.has(kind)) return;
  STRATA_ASSERT(values.size() == unit.layout.shard_numel, "shard size mismatch");
  for (std::size_t g = 0; g < unit.groups.size(); ++g) {
    const SubGroup& sub = unit.groups[g];
    STRATA_ASSERT(sub.begin + sub.numel <= values.size(), "a sub-group past its shard");
    write_group_fp32(id, kind, g, values.subspan(sub.begin, sub.numel));
  }
}

// The window is the home itself, or staging free outside the step: the conversion reads from or
// writes into it directly, so a sub-group costs no buffer of its own.
void EngineState::read_group_fp32(UnitId id, Kind kind, std::size_t group, std::span<float> out) {
  cancel_speculation();  // state read between the backward and step() is the committed state
  UnitState& unit = units_.at(id);
  const SubGroup& sub = unit.groups.at(group);
  STRATA_ASSERT(out.size() == sub.numel, "group size mismatch");
  std::byte* bytes = window(unit, kind, group, staging_outside_step(kind));
  fill(unit, kind, group, bytes);
  const ShardHome& home = unit.home(kind);
  if (home.quantized) {
    cpu_adam::decode_state(home.state_dtype(), moment_of(kind), bytes, sub.numel, out.data(),
                           *arena_);
    return;
  }
  cpu_adam::convert(cpu_adam::ConstTypedSpan(bytes, sub.numel, home.dtype), out, *arena_);
  // A compensated master's value is the weights plus their low parts (the staging is free again:
  // the weights are converted).
  if (kind == Kind::kMaster && unit.has(Kind::kCompensation)) {
    std::byte* low = window(unit, Kind::kCompensation, group,
                            staging_outside_step(Kind::kCompensation));
    fill(unit, Kind::kCompensation, group, low);
    cpu_adam::add_compensation(low, sub.numel, out.data(), *arena_);
  }
}

void EngineState::write_group_fp32(UnitId id, Kind kind, std::size_t group,
                                   std::span<const float> values) {
  cancel_speculation();
  UnitState& unit = units_.at(id);
  if (!unit.has(kind)) return;
  const SubGroup& sub = unit.groups.at(group);
  STRATA_ASSERT(values.size() == sub.numel, "group size mismatch");
  // A compensated master: the weights and their low parts, each a sub-group of bf16.
  if (kind == Kind::kMaster && unit.has(Kind::kCompensation)) {
    std::vector<std::byte> weights(sub.numel * 2);
    std::vector<std::byte> low(sub.numel * 2);
    cpu_adam::split_compensated(values.data(), sub.numel, weights.data(), low.data(), *arena_);
    write_group(unit, Kind::kMaster, group, weights);
    write_group(unit, Kind::kCompensation, group, low);
    return;
  }
  std::byte* bytes = window(unit, kind, group, staging_outside_step(kind));
  const ShardHome& home = unit.home(kind);
  if (home.quantized) {
    cpu_adam::encode_state(home.state_dtype(), moment_of(kind), values.data(), sub.numel, bytes,
                           *arena_);
  } else {
    cpu_adam::convert(values, cpu_adam::TypedSpan(bytes, sub.numel, home.dtype), *arena_);
  }
  flush(unit, kind, group, bytes);
}

std::uint64_t EngineState::largest_group_numel() const {
  std::uint64_t largest = 0;
  for (const UnitState& unit : units_) {
    for (const SubGroup& sub : unit.groups) largest = std::max(largest, sub.numel);
  }
  return largest;
}

void EngineState::wait_timed(tiers::StoreRead& read) {
  const auto start = std::chrono::steady_clock::now();
  if (!read.poll()) {
    Tracer::Scope scope(options_.tracer, TraceTrack::kIo, "NVMe read wait");
    read.wait();
  }
  read.wait();  // verifies the checksum (once)
  STRATA_ASSERT(read.poll(), "a read waited for and still in flight");
  io_wait_s_ += seconds_since(start);
}

void EngineState::wait_timed(const io::Ticket& ticket) {
  const auto start = std::chrono::steady_clock::now();
  if (!ticket.poll()) {
    Tracer::Scope scope(options_.tracer, TraceTrack::kIo, "NVMe write wait");
    ticket.wait();
  }
  ticket.get();
  STRATA_ASSERT(ticket.poll(), "a write waited for and still in flight");
  io_wait_s_ += seconds_since(start);
}

}  // namespace strata::runtime::detail

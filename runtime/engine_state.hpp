// The Engine's private state, shared by engine.cpp (setup, gather, gradients) and
// optimizer_step.cpp (the pipelined optimizer step). Not a public header.
#pragma once

#include <array>
#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include <tbb/task_arena.h>

#include "cpu_adam/dtype.hpp"
#include "cpu_adam/grad_norm.hpp"
#include "io/engine.hpp"
#include "runtime/comm/communicator.hpp"
#include "runtime/engine.hpp"
#include "runtime/partition.hpp"
#include "tiers/device/device.hpp"
#include "tiers/nvme_store.hpp"
#include "tiers/pinned_pool.hpp"
#include "tiers/residency.hpp"

namespace strata::runtime::detail {

// The state kinds each rank keeps per unit shard.
enum class Kind : std::uint8_t { kParam16, kGrad, kMaster, kExpAvg, kExpAvgSq };
inline constexpr std::size_t kKindCount = 5;
std::string_view kind_name(Kind kind);

// Where one state kind of one unit shard lives.
struct ShardHome {
  Tier tier = Tier::kDevice;
  cpu_adam::Dtype dtype = cpu_adam::Dtype::kFp32;
  std::uint64_t numel = 0;
  tiers::DeviceBuffer device;  // tier device
  tiers::PinnedBuffer host;    // tier host
  // Bytes the CPU may address: host tier, or device tier when the device's memory is host memory
  // and the Engine addresses it directly. Null on NVMe and for staged device memory (reached
  // only through streams: device_span()).
  std::byte* memory = nullptr;
  std::vector<tiers::ExtentId> extents;  // tier nvme: one per sub-group

  std::uint64_t element_bytes() const { return cpu_adam::dtype_bytes(dtype); }
  std::byte* at(std::uint64_t element) const { return memory + element * element_bytes(); }
  bool staged_on_device() const { return tier == Tier::kDevice && memory == nullptr; }
  tiers::DeviceSpan device_span(std::uint64_t element, std::uint64_t count) const {
    return device.span(element * element_bytes(), count * element_bytes());
  }
};

struct UnitState {
  UnitSpec spec;
  UnitLayout layout;
  std::vector<SubGroup> groups;
  std::array<std::optional<ShardHome>, kKindCount> homes;
  std::uint32_t grad_calls = 0;  // reduce_grads calls since the last step
  // Gathered for compute (device memory), managed by the residency manager.
  tiers::DeviceBuffer full16;  // padded numel in the parameter dtype (absent for fp32 params)
  tiers::DeviceBuffer full32;  // padded numel fp32: what GatheredUnit views
  std::vector<tiers::StoreRead> reads;  // NVMe parameter reads in flight
  // Staged device memory with parameters on NVMe: pinned memory the reads land in, copied to the
  // device by wait_load. A lease of EngineState::param_read_slab, or (more loads in flight than
  // the slab holds, when the schedule changes) a one-off buffer.
  tiers::PinnedLease param_lease;
  tiers::PinnedBuffer param_buffer;

  std::byte* param_staging() const {
    return param_lease ? param_lease.data() : param_buffer.data();
  }
  void release_param_staging() {
    param_lease.reset();
    param_buffer.reset();
  }

  ShardHome& home(Kind kind) { return *homes[static_cast<std::size_t>(kind)]; }
  bool has(Kind kind) const { return homes[static_cast<std::size_t>(kind)].has_value(); }
};

// The streams and events of the staged data path (device memory not addressable by the CPU): one
// stream per direction of copy and one for kernels, each with an event the host or another
// stream waits on. Owned by the Engine's thread.
struct DeviceLanes {
  explicit DeviceLanes(tiers::Device& device);
  tiers::Stream h2d;
  tiers::Stream d2h;
  tiers::Stream compute;
  tiers::Event h2d_done;
  tiers::Event d2h_done;
  tiers::Event compute_done;
  // The optimizer's two staging slots: d2h into a slot done / h2d out of it done.
  std::array<tiers::Event, 2> staged_in;
  std::array<tiers::Event, 2> staged_out;
};

struct EngineState final : tiers::ResidencyClient {
  EngineState(const Config& config_in, tiers::Device& device_in, comm::Communicator& comm_in,
              const EngineOptions& options_in);
  ~EngineState() override;

  // ResidencyClient: gathered units on the device.
  void start_load(tiers::UnitId unit) override;
  bool load_complete(tiers::UnitId unit) override;
  void wait_load(tiers::UnitId unit) override;
  void write_back(tiers::UnitId unit) override;
  void evict(tiers::UnitId unit) override;

  void finalize();
  void initialise_fresh();
  void optimizer_step(StepStats& stats);
  // Reads [group] of `kind` into `out` (NVMe, synchronously) or copies it from memory.
  void read_group(UnitState& unit, Kind kind, std::size_t group, std::span<std::byte> out);
  void write_group_sync(UnitState& unit, Kind kind, std::size_t group,
                        std::span<const std::byte> data);
  std::vector<float> read_shard_fp32(UnitState& unit, Kind kind);
  void wait_timed(tiers::StoreRead& read);
  void wait_timed(const io::Ticket& ticket);
  double loss_scale_for_step() const;

  // Device memory access (runtime/engine_device.cpp). Each returns once the bytes have arrived:
  // a memcpy or CPU loop when device memory is addressable, else stream work waited on.
  void copy_to_device(tiers::DeviceSpan dst, const void* host_src);
  void copy_to_host(void* host_dst, tiers::DeviceSpan src);
  // The optimizer's device-homed sub-groups go through device_staging, two slots so the d2h of
  // the next sub-group overlaps Adam on this one: stage_in (d2h, returns at once), wait_staged_in
  // before Adam, stage_out (h2d, returns at once) after it, finish_staging at the step's end.
  void stage_in(UnitState& unit, std::size_t group, std::size_t slot, std::span<const Kind> kinds);
  void wait_staged_in(std::size_t slot);
  void stage_out(UnitState& unit, std::size_t group, std::size_t slot, std::span<const Kind> kinds);
  void finish_staging();
  // Slot 0 doubles as the staging of read_group / write_group_sync (outside the step).
  std::byte* device_staging_at(Kind kind, std::size_t slot = 0) const;
  // A collective on host buffers over any backend (staged through device memory for NcclComm).
  void all_gather_host(comm::ConstBuffer send, comm::MutableBuffer recv);
  // The unit's gather once its NVMe reads are done: own shard, all-gather, cast to fp32.
  void finish_gather(UnitState& unit);
  // Engine::reduce_grads once its arguments are checked.
  void reduce_grads(UnitState& unit, std::span<const float> full_grads);

  Config config;
  EngineOptions options;
  tiers::Device* device;
  comm::Communicator* comm;
  std::uint32_t rank = 0;
  std::uint32_t ranks = 1;
  cpu_adam::Dtype param_dtype = cpu_adam::Dtype::kBf16;
  cpu_adam::Dtype grad_dtype = cpu_adam::Dtype::kBf16;
  std::vector<UnitState> units;
  bool finalized = false;
  std::uint64_t step_count = 0;
  double loss_scale = 1.0;
  std::uint32_t clean_steps = 0;
  // The data path (EngineOptions::DeviceAccess): whether the CPU addresses device memory, and
  // whether collectives of device data take device memory directly.
  bool device_addressable = true;
  bool comm_on_device = true;
  std::unique_ptr<DeviceLanes> lanes;  // the staged path only

  std::unique_ptr<tbb::task_arena> arena;
  std::unique_ptr<tiers::PinnedPool> host_pool;
  std::unique_ptr<io::Engine> io_engine;
  std::unique_ptr<tiers::NvmeStore> store;
  std::unique_ptr<tiers::ResidencyManager> residency;
  cpu_adam::GradNormAccumulator norm;

  // Scratch: the padded fp32 gradient of one unit and this rank's reduced shard (device memory);
  // a copy of this rank's parameter shard for the all-gather's send side.
  tiers::DeviceBuffer grad_full_scratch;
  tiers::DeviceBuffer grad_shard_scratch;
  tiers::DeviceBuffer gather_send_scratch;
  // Pinned staging: optimizer pipeline buffers (buffer_count) and gradient write buffers.
  std::vector<tiers::PinnedBuffer> pipeline_buffers;
  std::uint64_t pipeline_buffer_bytes = 0;
  std::array<std::uint64_t, kKindCount> pipeline_offsets{};  // per NVMe kind, in a pipeline buffer
  std::array<tiers::PinnedBuffer, 2> grad_buffers;
  std::array<std::vector<io::Ticket>, 2> grad_buffer_writes;
  std::size_t next_grad_buffer = 0;
  // Staged path only (pinned): one sub-group of every device-homed kind for the optimizer and
  // read_group / write_group_sync; one gradient shard in fp32; and, for collectives on the host,
  // one padded unit in fp32.
  tiers::PinnedBuffer device_staging;  // two slots of device_staging_slot_bytes
  std::uint64_t device_staging_slot_bytes = 0;
  std::array<std::uint64_t, kKindCount> device_staging_offsets{};
  tiers::PinnedBuffer shard_staging;
  tiers::PinnedBuffer full_staging;
  std::optional<tiers::PinnedSlab> param_read_slab;  // params on NVMe: prefetch_depth + 2 shards

  // Statistics since the last step.
  double io_wait_s = 0;
  std::uint64_t nvme_read_mark = 0;
  std::uint64_t nvme_written_mark = 0;
};

double seconds_since(std::chrono::steady_clock::time_point start);

}  // namespace strata::runtime::detail

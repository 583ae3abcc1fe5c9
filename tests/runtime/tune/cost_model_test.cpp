// Proves the tune cost model's arithmetic on synthetic machines: Adam alone when nothing streams,
// NVMe bytes from strata plan over the measured bandwidths, overlap by buffer_count and
// prefetch_depth, copies on a GPU, the checksum thread, the durable commit and the calibrated
// per-sub-group cost, no prediction for NVMe state on unmeasured drives, and compressed state
// priced at its own update's rate and its own (smaller) NVMe bytes.
#include <cmath>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/tune/cost_model.hpp"

namespace strata::runtime::tune {
namespace {

MachineProfile synthetic_machine() {
  MachineProfile m;
  m.io = {{1 << 20, 16, 1, 2000, 1000, 1500}, {4 << 20, 64, 2, 3000, 2000, 2500}};
  m.host_memory_gb_per_s = 20;
  m.adam = {{1, 1e8}, {2, 2e8}, {4, 3e8}};
  return m;
}

Config base_config() {
  Config c = parse_config("[tiers.nvme]\npaths = [\"/tmp\"]\n[tiers.device]\nkind = \"host\"\n");
  c.optimizer.threads = 2;
  return c;
}

const StateRow& row(const MemoryPlan& plan, StateKind kind) {
  for (const StateRow& r : plan.states) {
    if (r.kind == kind) return r;
  }
  throw std::logic_error("no row");
}

TEST(CostModel, NothingStreamedIsAdamAlone) {
  Config c = base_config();
  c.zero.optimizer = Tier::kHost;
  const StepPrediction p = predict_step(c, PlanInputs(1'000'000'000, 1), synthetic_machine());
  const double elements = static_cast<double>(row(p.plan, StateKind::kOptimizer).elements_per_rank);
  EXPECT_DOUBLE_EQ(p.adam_s, elements / 2e8);
  EXPECT_EQ(p.nvme_optimizer_s, 0);
  EXPECT_EQ(p.forward_backward_s, 0);
  EXPECT_DOUBLE_EQ(p.step_s, p.adam_s);
}

TEST(CostModel, OptimizerOnNvmeMovesThePlansBytesAtTheMixedRate) {
  Config c = base_config();
  c.zero.optimizer = Tier::kNvme;
  c.zero.sub_group_size = 1 << 24;  // fills the engine's 16 MiB in flight
  const StepPrediction p = predict_step(c, PlanInputs(1'000'000'000, 1), synthetic_machine());
  const NvmeTraffic& t = p.plan.traffic(StateKind::kOptimizer);
  EXPECT_GT(t.read_bytes, 0u);
  EXPECT_EQ(p.io_fill, 1.0);
  EXPECT_DOUBLE_EQ(p.nvme_optimizer_s, static_cast<double>(t.read_bytes + t.write_bytes) / 1500e6);
  const double longer = std::max(p.nvme_optimizer_s, p.adam_s);
  const double shorter = std::min(p.nvme_optimizer_s, p.adam_s);
  EXPECT_DOUBLE_EQ(p.optimizer_s, longer + shorter / static_cast<double>(p.sub_groups));
}

// The store hashes every byte on one thread: a slower checksum than the disk bounds the I/O lane.
TEST(CostModel, TheChecksumThreadIsALaneOfItsOwn) {
  Config c = base_config();
  c.zero.optimizer = Tier::kNvme;
  c.zero.sub_group_size = 1 << 24;
  const PlanInputs inputs(1'000'000'000, 1);
  MachineProfile m = synthetic_machine();
  const StepPrediction unhashed = predict_step(c, inputs, m);
  EXPECT_EQ(unhashed.checksum_s, 0);
  m.checksum_gb_per_s = 0.75;  // half the mixed rate
  const StepPrediction hashed = predict_step(c, inputs, m);
  const NvmeTraffic& t = hashed.plan.traffic(StateKind::kOptimizer);
  EXPECT_DOUBLE_EQ(hashed.checksum_s, static_cast<double>(t.read_bytes + t.write_bytes) / 750e6);
  EXPECT_DOUBLE_EQ(hashed.checksum_s, 2 * hashed.nvme_optimizer_s);
  const double longer = std::max(hashed.checksum_s, hashed.adam_s);
  const double shorter = std::min(hashed.checksum_s, hashed.adam_s);
  EXPECT_DOUBLE_EQ(hashed.optimizer_s, longer + shorter / static_cast<double>(hashed.sub_groups));
}

// [tiers.nvme] fsync: the commit flushes every byte the step wrote, at the median flush rate of
// the measured points; without fsync, nothing. Calibrated sub-group cost: per sub-group.
TEST(CostModel, TheCommitAndTheSubGroupsAddTheirTime) {
  Config c = base_config();
  c.zero.params = c.zero.grads = c.zero.optimizer = Tier::kNvme;
  c.zero.sub_group_size = 1 << 24;
  const PlanInputs inputs(1'000'000'000, 1);
  MachineProfile m = synthetic_machine();
  const StepPrediction plain = predict_step(c, inputs, m);
  EXPECT_EQ(plain.commit_s, 0);
  m.io[0].flush_mb_per_s = 400;
  m.io[1].flush_mb_per_s = 600;
  m.io.push_back({1 << 20, 4, 1, 2000, 1000, 1500, 5000});
  EXPECT_EQ(flush_mb_per_s(m), 600);
  m.sub_group_overhead_s = 0.002;
  const StepPrediction p = predict_step(c, inputs, m);
  EXPECT_DOUBLE_EQ(p.commit_s, static_cast<double>(p.plan.nvme_write_bytes_per_step) / 600e6);
  EXPECT_DOUBLE_EQ(p.overhead_s, 0.002 * static_cast<double>(p.sub_groups));
  EXPECT_DOUBLE_EQ(p.optimizer_s, plain.optimizer_s + p.commit_s + p.overhead_s);
  c.tiers.nvme.fsync = false;
  EXPECT_EQ(predict_step(c, inputs, m).commit_s, 0);
}

TEST(CostModel, TwoBuffersCannotOverlapReadsWithAdam) {
  Config c = base_config();
  c.zero.optimizer = Tier::kNvme;
  c.zero.buffer_count = 2;
  const StepPrediction p = predict_step(c, PlanInputs(1'000'000'000, 1), synthetic_machine());
  EXPECT_DOUBLE_EQ(p.optimizer_s, p.nvme_optimizer_s + p.adam_s);
}

TEST(CostModel, SmallSubGroupsCannotFillTheQueues) {
  Config c = base_config();
  c.zero.optimizer = Tier::kNvme;
  c.zero.sub_group_size = 1 << 16;  // 3 groups x 64 Ki x 12 B in flight, against 16 MiB
  const StepPrediction small = predict_step(c, PlanInputs(1'000'000'000, 1), synthetic_machine());
  c.zero.sub_group_size = 1 << 24;
  const StepPrediction large = predict_step(c, PlanInputs(1'000'000'000, 1), synthetic_machine());
  EXPECT_LT(small.io_fill, 1.0);
  EXPECT_NEAR(small.io_fill, 3.0 * (1 << 16) * 12 / (16.0 * (1 << 20)), 1e-12);
  EXPECT_GT(small.nvme_optimizer_s, large.nvme_optimizer_s);
}

TEST(CostModel, ShallowInFlightTakesTheRateMeasuredAtThatDepth) {
  Config c = base_config();
  c.zero.optimizer = Tier::kNvme;
  MachineProfile m = synthetic_machine();
  m.io.push_back({1 << 20, 4, 1, 1500, 800, 1200});  // the same block and rings at depth 4
  // 3 groups of 2^18 elements x 12 B in flight = 9 MiB: depth 9, between the measured 4 and 16.
  c.zero.sub_group_size = 1 << 18;
  const double t = (std::log2(9.0) - 2.0) / 2.0;
  EXPECT_NEAR(predict_step(c, PlanInputs(1'000'000'000, 1), m).io_fill,
              (1200 + t * (1500 - 1200)) / 1500, 1e-12);
  // 2^16 elements: depth 2.25, below every depth measured: proportional to the shallowest.
  c.zero.sub_group_size = 1 << 16;
  EXPECT_NEAR(predict_step(c, PlanInputs(1'000'000'000, 1), m).io_fill,
              1200 * (2.25 / 4) / 1500, 1e-12);
}

// The Engine's calibration scales every rate the optimizer's NVMe term uses, the one interpolated
// at a shallow in-flight depth too: with two buffers and small sub-groups the prediction never
// reads the chosen point's own rate, and a calibration of that rate alone moved nothing (strata
// tune then bisected to its bound).
TEST(CostModel, TheEngineScaleMovesTheRateInterpolatedAtAShallowDepth) {
  Config c = base_config();
  c.zero.optimizer = Tier::kNvme;
  c.zero.buffer_count = 2;
  c.zero.sub_group_size = 1 << 18;  // 3 MiB in flight: depth 3 of the 16 measured
  MachineProfile m = synthetic_machine();
  m.io.push_back({1 << 20, 4, 1, 1500, 800, 1200});
  const PlanInputs inputs(1'000'000'000, 1);
  const StepPrediction probe = predict_step(c, inputs, m);
  EXPECT_LT(probe.io_fill, 1.0);
  m.engine_io_scale = 0.5;
  const StepPrediction halved = predict_step(c, inputs, m);
  EXPECT_DOUBLE_EQ(halved.nvme_optimizer_s, 2 * probe.nvme_optimizer_s);
  m.io.front().mixed_mb_per_s *= 2;  // the point's own rate: not what a shallow depth reads
  EXPECT_DOUBLE_EQ(predict_step(c, inputs, m).nvme_optimizer_s, halved.nvme_optimizer_s);
}

TEST(CostModel, TheEngineScaleIsFittedToAMeasuredOptimizerPhase) {
  Config c = base_config();
  c.zero.optimizer = Tier::kNvme;
  c.zero.buffer_count = 2;
  c.zero.sub_group_size = 1 << 18;
  MachineProfile m = synthetic_machine();
  m.io.push_back({1 << 20, 4, 1, 1500, 800, 1200});
  const PlanInputs inputs(1'000'000'000, 1);
  for (double truth : {0.3, 1.0, 1.7}) {
    MachineProfile engine = m;
    engine.engine_io_scale = truth;
    const double measured = predict_step(c, inputs, engine).optimizer_s;
    const EngineIoFit fit = fit_engine_io_scale(c, inputs, m, measured);
    EXPECT_FALSE(fit.at_bound);
    EXPECT_NEAR(fit.scale, truth, 1e-9 * truth);
  }
  // Faster than the other lanes allow (Adam alone takes longer) or slower than 1/8 of the rates
  // explains: the nearest bound, flagged.
  const EngineIoFit fast = fit_engine_io_scale(c, inputs, m, 1e-6);
  EXPECT_TRUE(fast.at_bound);
  EXPECT_EQ(fast.scale, 8);
  const EngineIoFit slow = fit_engine_io_scale(c, inputs, m, 1e6);
  EXPECT_TRUE(slow.at_bound);
  EXPECT_EQ(slow.scale, 1.0 / 8);
}

TEST(CostModel, PrefetchOverlapsParameterReadsWithCompute) {
  Config c = base_config();
  c.zero.params = Tier::kNvme;
  MachineProfile m = synthetic_machine();
  m.compute_flops = 1e12;
  c.zero.prefetch_depth = 2;
  const StepPrediction overlapped = predict_step(c, PlanInputs(1'000'000'000, 1), m);
  c.zero.prefetch_depth = 0;
  const StepPrediction serial = predict_step(c, PlanInputs(1'000'000'000, 1), m);
  const double reads = static_cast<double>(overlapped.plan.traffic(StateKind::kParams).read_bytes);
  EXPECT_DOUBLE_EQ(overlapped.nvme_forward_backward_s, reads / 2000e6);  // the read rate
  const double tokens = 8.0 * 128;  // [model] micro_batch x seq_len
  EXPECT_DOUBLE_EQ(overlapped.compute_s, 6.0 * 1e9 * tokens / 1e12);
  EXPECT_DOUBLE_EQ(overlapped.forward_backward_s,
                   std::max(overlapped.compute_s, overlapped.nvme_forward_backward_s));
  EXPECT_DOUBLE_EQ(serial.forward_backward_s, serial.compute_s + serial.nvme_forward_backward_s);
}

// The synthetic machine with pinned copies measured: 20 GB/s h2d, 10 GB/s d2h.
MachineProfile machine_with_a_gpu() {
  MachineProfile m = synthetic_machine();
  m.h2d_gb_per_s = 20;
  m.d2h_gb_per_s = 10;
  return m;
}

TEST(CostModel, GpuCopiesCountOnlyOnARealDevice) {
  Config c = base_config();
  c.zero.params = Tier::kHost;
  const MachineProfile m = machine_with_a_gpu();
  const StepPrediction host = predict_step(c, PlanInputs(1'000'000'000, 1), m);
  EXPECT_EQ(host.transfer_s, 0);  // the host device addresses every home
  c.tiers.device.kind = DeviceKind::kCuda;
  const StepPrediction cuda = predict_step(c, PlanInputs(1'000'000'000, 1), m);
  const double params_bytes = static_cast<double>(row(cuda.plan, StateKind::kParams).bytes_per_rank);
  EXPECT_DOUBLE_EQ(cuda.transfer_s, 2 * params_bytes / 20e9);  // two gathers at stage 3
}

// [zero] optimizer_device_fraction on a real device: the CPU updates only the rest, and only the
// rest's gradients and parameters cross the bus; all state on the device crosses nothing. On the
// host device the CPU updates everything whatever the share.
TEST(CostModel, TheDeviceShareOfTheOptimizerLeavesTheCpuAndTheBus) {
  Config c = base_config();
  c.zero.optimizer = Tier::kHost;
  const MachineProfile m = machine_with_a_gpu();
  const PlanInputs inputs(1'000'000'000, 1, std::vector<std::uint64_t>(4, 250'000'000));
  const StepPrediction host_device = predict_step(c, inputs, m);
  c.zero.optimizer_device_fraction = 0.5;
  EXPECT_DOUBLE_EQ(predict_step(c, inputs, m).adam_s, host_device.adam_s);
  c.tiers.device.kind = DeviceKind::kCuda;
  const StepPrediction half = predict_step(c, inputs, m);
  c.zero.optimizer_device_fraction = 0;
  const StepPrediction none = predict_step(c, inputs, m);
  EXPECT_DOUBLE_EQ(none.adam_s, host_device.adam_s);
  EXPECT_NEAR(half.adam_s, none.adam_s / 2, none.adam_s * 1e-6);
  EXPECT_LT(half.optimizer_s, none.optimizer_s);
  c.zero.optimizer = Tier::kDevice;
  const StepPrediction all_device = predict_step(c, inputs, m);
  EXPECT_EQ(all_device.adam_s, 0);
  EXPECT_EQ(all_device.optimizer_s, 0);
}

TEST(CostModel, NvmeStateOnUnmeasuredDrivesIsNotPredicted) {
  Config c = base_config();
  c.zero.optimizer = Tier::kNvme;
  MachineProfile m = synthetic_machine();
  m.io.clear();
  EXPECT_TRUE(std::isinf(predict_step(c, PlanInputs(1'000'000, 1), m).step_s));
}

TEST(CostModel, LooksUpTheNearestMeasuredPoints) {
  const MachineProfile m = synthetic_machine();
  NvmeTierConfig nvme;
  nvme.block_size = 8 << 20;
  nvme.queue_depth = 32;
  nvme.rings = 2;
  EXPECT_EQ(nearest_io_point(m, nvme).block_bytes, 4u << 20);
  nvme.block_size = 512 << 10;
  nvme.queue_depth = 8;
  nvme.rings = 1;
  EXPECT_EQ(nearest_io_point(m, nvme).block_bytes, 1u << 20);
  EXPECT_EQ(adam_params_per_s(m, 0, {}), 3e8);  // every thread: the best measured
  EXPECT_EQ(adam_params_per_s(m, 3, {}), 3e8);  // log2(3) is nearer 4 than 2
  EXPECT_EQ(adam_params_per_s(m, 1, {}), 1e8);
}

// Int8 moments and a bf16 master: the update the Engine runs is step_compressed.
constexpr AdamUpdate kInt8Bf16{cpu_adam::StateDType::kBf16, cpu_adam::StateDType::kInt8};

Config compressed(Config c) {
  c.optimizer.master_dtype = cpu_adam::StateDType::kBf16;
  c.optimizer.state_dtype = cpu_adam::StateDType::kInt8;
  return c;
}

TEST(CostModel, CompressedStateIsPricedAtItsOwnUpdatesRate) {
  MachineProfile m = synthetic_machine();
  // The fused update, half the fp32 rate at 2 threads, and a faster point of another format.
  m.adam.push_back({2, 1e8, kInt8Bf16});
  m.adam.push_back({2, 9e8, {cpu_adam::StateDType::kFp32, cpu_adam::StateDType::kBf16}});
  Config c = base_config();
  c.zero.optimizer = Tier::kHost;
  const PlanInputs inputs(1'000'000'000, 1);
  const StepPrediction fp32 = predict_step(c, inputs, m);
  const StepPrediction int8 = predict_step(compressed(c), inputs, m);
  const double elements =
      static_cast<double>(row(int8.plan, StateKind::kOptimizer).elements_per_rank);
  EXPECT_DOUBLE_EQ(fp32.adam_s, elements / 2e8);
  EXPECT_DOUBLE_EQ(int8.adam_s, elements / 1e8);
  EXPECT_DOUBLE_EQ(int8.step_s, int8.adam_s);
  EXPECT_EQ(adam_update(compressed(c)), kInt8Bf16);
  EXPECT_EQ(adam_params_per_s(m, 0, kInt8Bf16), 1e8);  // not the fp32 best, 3e8
  EXPECT_THAT(describe_adam_update(kInt8Bf16),
              ::testing::HasSubstr("step_compressed (bf16 master, int8 moments)"));
  EXPECT_THAT(describe_adam_update({}), ::testing::HasSubstr("cpu_adam::step (fp32"));
}

// A profile without the config's update has no rate for it: the fp32 one would misprice the step.
TEST(CostModel, CompressedStateWithoutItsMeasuredRateIsNotPredicted) {
  Config c = compressed(base_config());
  c.zero.optimizer = Tier::kHost;
  const MachineProfile m = synthetic_machine();  // fp32 points only
  EXPECT_EQ(adam_params_per_s(m, 2, kInt8Bf16), 0);
  const StepPrediction p = predict_step(c, PlanInputs(1'000'000'000, 1), m);
  EXPECT_TRUE(std::isinf(p.adam_s));
  EXPECT_TRUE(std::isinf(p.step_s));
}

// The optimizer phase streams the state in its stored formats: bf16 master + two int8 moments
// (2 + 2 x 1024/1020 bytes) instead of 12 bytes of fp32 per parameter.
TEST(CostModel, Int8StateShrinksTheOptimizerPhasesNvmeBytes) {
  MachineProfile m = synthetic_machine();
  m.adam.push_back({2, 1e8, kInt8Bf16});
  Config c = base_config();
  c.zero.optimizer = Tier::kNvme;
  c.zero.sub_group_size = 1 << 24;  // fills the engine's 16 MiB in flight in both formats
  const PlanInputs inputs(1'000'000'000, 1);
  const StepPrediction fp32 = predict_step(c, inputs, m);
  const StepPrediction int8 = predict_step(compressed(c), inputs, m);
  const NvmeTraffic& t32 = fp32.plan.traffic(StateKind::kOptimizer);
  const NvmeTraffic& t8 = int8.plan.traffic(StateKind::kOptimizer);
  const double ratio = static_cast<double>(t8.read_bytes) / static_cast<double>(t32.read_bytes);
  EXPECT_NEAR(ratio, (2.0 + 2.0 * 1024 / 1020) / 12.0, 1e-3);
  EXPECT_EQ(int8.io_fill, 1.0);
  EXPECT_DOUBLE_EQ(int8.nvme_optimizer_s,
                   static_cast<double>(t8.read_bytes + t8.write_bytes) / 1500e6);
  EXPECT_LT(int8.nvme_optimizer_s, 0.35 * fp32.nvme_optimizer_s);
  EXPECT_LT(int8.plan.nvme_write_bytes_per_step, fp32.plan.nvme_write_bytes_per_step);
}

}  // namespace
}  // namespace strata::runtime::tune

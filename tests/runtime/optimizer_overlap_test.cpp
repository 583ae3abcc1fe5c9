// Proves the optimizer step is pipelined, not serial: with state on NVMe, the reads of sub-group
// k+1 are in flight (issued, not yet used) for the whole of Adam on sub-group k. Structural, read
// from the tracer's recorded intervals, not timed; a serial pipeline (one buffer computing, one
// draining, nothing read ahead) is shown to fail the same check.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/comm/local_comm.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/engine/trace.hpp"
#include "tests/io/io_test_support.hpp"
#include "tests/runtime/engine_test_config.hpp"
#include "tests/runtime/engine_test_model.hpp"

namespace strata::runtime {
namespace {

using io::testing::ScratchDir;
using testing::host_device;
using testing::kEngineTestWidths;
using testing::TinyMlp;

struct StepTimeline {
  std::vector<Tracer::Event> adam;   // one per sub-group, in update order
  std::vector<Tracer::Event> reads;  // one per sub-group: its NVMe reads, issue to use
};

// One training step with every optimizer state kind on NVMe, traced.
StepTimeline traced_step(std::uint32_t buffer_count) {
  ScratchDir dir;
  Config config = testing::engine_test_config(dir.path().string());
  config.zero.optimizer = Tier::kNvme;
  config.zero.buffer_count = buffer_count;
  config.zero.sub_group_size = 1024;  // several sub-groups per unit
  config.zero.overlap_optimizer = false;  // the pipeline inside step() (speculative_step_test.cpp)
  Tracer tracer;
  EngineOptions options;
  options.tracer = &tracer;
  auto device = host_device(config);
  comm::LocalComm comm;
  Engine engine(config, *device, comm, options);
  TinyMlp model(kEngineTestWidths, 16, /*data_seed=*/7);
  model.add_units(engine);
  engine.finalize();
  model.train_step(engine);
  engine.step();
  StepTimeline timeline;
  for (const Tracer::Event& event : tracer.events()) {
    if (event.track == TraceTrack::kOptimizer && event.name.rfind("adam ", 0) == 0) {
      timeline.adam.push_back(event);
    } else if (event.track == TraceTrack::kIo && event.name.rfind("NVMe read ", 0) == 0 &&
               event.name != "NVMe read wait") {
      timeline.reads.push_back(event);
    }
  }
  return timeline;
}

// The sub-groups k whose Adam did not run entirely while sub-group k+1's reads were in flight.
std::vector<std::string> serial_points(const StepTimeline& timeline) {
  std::vector<std::string> serial;
  for (std::size_t k = 0; k + 1 < timeline.adam.size(); ++k) {
    const Tracer::Event& adam = timeline.adam[k];
    const Tracer::Event& next_read = timeline.reads[k + 1];
    if (!(next_read.start <= adam.start && adam.end <= next_read.end)) {
      serial.push_back(adam.name + " vs " + next_read.name);
    }
  }
  return serial;
}

TEST(OptimizerOverlap, NextSubGroupsReadsAreInFlightDuringAdam) {
  const StepTimeline timeline = traced_step(/*buffer_count=*/4);
  ASSERT_GE(timeline.adam.size(), 4u) << "the model should have several sub-groups";
  ASSERT_EQ(timeline.reads.size(), timeline.adam.size());
  const std::vector<std::string> serial = serial_points(timeline);
  EXPECT_TRUE(serial.empty()) << serial.size() << " sub-groups ran Adam with nothing read ahead, "
                              << "e.g. " << serial.front();
}

TEST(OptimizerOverlap, ASerialPipelineFailsTheCheck) {
  // Two buffers: one computes, one drains, so reads are issued only after the previous Adam.
  const StepTimeline timeline = traced_step(/*buffer_count=*/2);
  ASSERT_EQ(timeline.reads.size(), timeline.adam.size());
  EXPECT_EQ(serial_points(timeline).size(), timeline.adam.size() - 1);
}

}  // namespace
}  // namespace strata::runtime

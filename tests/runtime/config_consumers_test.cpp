// Proves every key docs/config.md documents is read by the code it configures, not only parsed:
// each key has an entry below naming the consumer (a source file outside the loader) and the
// expression that reads it there, and the file holds it. A key documented without a consumer, or a
// consumer that stopped reading its key, fails here. Behaviour is proved elsewhere (the tests
// listed with each entry name where, for the keys issue 14 wired up).
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

namespace strata {
namespace {

struct Consumer {
  const char* file;   // relative to the source tree; never runtime/config/config.cpp's readers
  const char* reads;  // text that reads the key there
};

// "section.key" -> who reads it.
const std::map<std::string, Consumer> kConsumers = {
    {"run.ranks", {"runtime/cli/plan_command.cpp", "config.run.ranks"}},
    {"run.seed", {"runtime/engine/engine_finalize.cpp", "config_.run.seed"}},
    {"tiers.device.kind", {"runtime/plan/rank_placement.cpp", "config.tiers.device.kind"}},
    {"tiers.device.index", {"runtime/plan/rank_placement.cpp", "device.index"}},
    {"tiers.device.budget", {"runtime/plan/rank_placement.cpp", "config.tiers.device.budget_bytes"}},
    {"tiers.host.budget", {"runtime/engine/engine_finalize.cpp", "config_.tiers.host.budget_bytes"}},
    // host_pinned_test.cpp
    {"tiers.host.pinned", {"runtime/engine/engine_finalize.cpp", "config_.tiers.host.pinned"}},
    {"tiers.nvme.paths", {"runtime/engine/engine_finalize.cpp", "nvme.paths"}},
    {"tiers.nvme.budget", {"runtime/engine/engine_finalize.cpp", "config_.tiers.nvme.budget_bytes"}},
    {"tiers.nvme.block_size", {"runtime/engine/engine_finalize.cpp", "nvme.block_size"}},
    {"tiers.nvme.queue_depth", {"runtime/engine/engine_finalize.cpp", "nvme.queue_depth"}},
    {"tiers.nvme.rings", {"runtime/engine/engine_finalize.cpp", "nvme.rings"}},
    {"tiers.nvme.direct", {"runtime/engine/engine_finalize.cpp", "nvme.direct"}},
    {"tiers.nvme.engine", {"runtime/engine/engine_finalize.cpp", "nvme.engine"}},
    {"tiers.nvme.fsync", {"runtime/engine/engine_finalize.cpp", "nvme.fsync"}},
    {"tiers.nvme.on_existing", {"runtime/engine/engine_finalize.cpp", "nvme.on_existing"}},
    {"comm.backend", {"runtime/plan/rank_placement.cpp", "config.comm.backend"}},
    {"tiers.host.nvme_read_cache", {"runtime/engine/engine_finalize.cpp", "host.nvme_read_cache"}},
    {"zero.stage", {"runtime/engine/engine_finalize.cpp", "zero.stage"}},
    {"zero.params", {"runtime/plan/buffer_plan.cpp", "zero.params"}},
    {"zero.grads", {"runtime/plan/buffer_plan.cpp", "zero.grads"}},
    {"zero.optimizer", {"runtime/plan/buffer_plan.cpp", "zero.optimizer"}},
    {"zero.sub_group_size", {"runtime/engine/engine_finalize.cpp", "config_.zero.sub_group_size"}},
    // engine_test.cpp: EngineOptimizerHostFraction
    {"zero.optimizer_host_fraction", {"runtime/plan/buffer_plan.cpp", "zero.optimizer_host_fraction"}},
    // engine_test.cpp: EngineOptimizerDeviceFraction
    {"zero.optimizer_device_fraction", {"runtime/plan/buffer_plan.cpp", "zero.optimizer_device_fraction"}},
    // engine_test.cpp: EngineParamsGradsHostFraction
    {"zero.params_host_fraction", {"runtime/plan/buffer_plan.cpp", "zero.params_host_fraction"}},
    {"zero.grads_host_fraction", {"runtime/plan/buffer_plan.cpp", "zero.grads_host_fraction"}},
    {"zero.overlap_optimizer", {"runtime/engine/speculation.cpp", "config_.zero.overlap_optimizer"}},
    {"zero.defer_update", {"runtime/engine/engine_state.hpp", "config_.zero.defer_update"}},
    {"zero.prefetch_depth", {"runtime/engine/engine_finalize.cpp", "zero.prefetch_depth"}},
    {"zero.buffer_count", {"runtime/plan/buffer_plan.cpp", "config.zero.buffer_count"}},
    {"zero.persistence_threshold", {"runtime/engine/engine_finalize.cpp", "zero.persistence_threshold"}},
    {"zero.max_inflight_bytes", {"runtime/engine/engine_finalize.cpp", "zero.max_inflight_bytes"}},
    {"optimizer.type", {"runtime/engine/optimizer_step.cpp", "optimizer.type"}},
    {"optimizer.lr", {"runtime/config/lr_schedule.cpp", "optimizer.lr"}},
    {"optimizer.betas", {"runtime/engine/optimizer_step.cpp", "optimizer.beta1"}},
    {"optimizer.eps", {"runtime/engine/optimizer_step.cpp", "optimizer.eps"}},
    {"optimizer.weight_decay", {"runtime/engine/optimizer_step.cpp", "optimizer.weight_decay"}},
    {"optimizer.bias_correction", {"runtime/engine/optimizer_step.cpp", "optimizer.bias_correction"}},
    {"optimizer.grad_clip", {"runtime/engine/optimizer_step.cpp", "config_.optimizer.grad_clip"}},
    {"optimizer.threads", {"runtime/engine/engine_setup.cpp", "config_.optimizer.threads"}},
    {"optimizer.warmup_steps", {"runtime/config/lr_schedule.cpp", "optimizer.warmup_steps"}},
    {"optimizer.schedule", {"runtime/config/lr_schedule.cpp", "optimizer.schedule"}},
    {"optimizer.lr_decay_steps", {"runtime/config/lr_schedule.cpp", "optimizer.lr_decay_steps"}},
    {"optimizer.min_lr", {"runtime/config/lr_schedule.cpp", "optimizer.min_lr"}},
    {"optimizer.state_dtype", {"runtime/plan/buffer_plan.cpp", "config.optimizer.state_dtype"}},
    {"optimizer.master_dtype", {"runtime/plan/buffer_plan.cpp", "config.optimizer.master_dtype"}},
    {"optimizer.master_rounding", {"runtime/plan/buffer_plan.cpp", "optimizer.master_rounding"}},
    {"precision.params", {"runtime/engine/engine_setup.cpp", "config.precision.params"}},
    {"precision.grads", {"runtime/engine/engine_setup.cpp", "config.precision.grads"}},
    {"precision.reduce_dtype", {"runtime/engine/engine_setup.cpp", "gradient_reduce_dtype("}},
    {"precision.dynamic_loss_scale",
     {"runtime/engine/optimizer_step.cpp", "config_.precision.dynamic_loss_scale"}},
    {"precision.loss_scale", {"runtime/engine/engine_setup.cpp", "config_.precision.loss_scale"}},
    {"precision.loss_scale_window",
     {"runtime/engine/optimizer_step.cpp", "config_.precision.loss_scale_window"}},
    {"precision.min_loss_scale",
     {"runtime/engine/optimizer_step.cpp", "config_.precision.min_loss_scale"}},
    // periodic_checkpoints_test.cpp, finetune_program_test.cpp
    {"checkpoint.dir", {"runtime/checkpoint/periodic_checkpoints.cpp", "config_.dir"}},
    {"checkpoint.interval_steps", {"runtime/checkpoint/periodic_checkpoints.cpp", "config_.interval_steps"}},
    {"checkpoint.keep", {"runtime/checkpoint/periodic_checkpoints.cpp", "config_.keep"}},
    // finetune_program_test.cpp (strata-finetune), plan_command_test.cpp (strata bench step)
    {"trace.path", {"examples/finetune/finetune_main.cpp", "config.trace.path"}},
    // Config::parameter_count, the count `strata plan` uses.
    {"model.params", {"runtime/config/config.cpp", "model.params != 0 ? model.params"}},
    {"model.layers", {"models/gpt/gpt_spec.cpp", "config.layers"}},
    {"model.d_model", {"models/gpt/gpt_spec.cpp", "config.d_model"}},
    {"model.heads", {"models/gpt/gpt_model.cpp", "config_.heads"}},
    {"model.seq_len", {"models/gpt/gpt_spec.cpp", "config.seq_len"}},
    {"model.vocab", {"models/gpt/gpt_spec.cpp", "config.vocab"}},
    {"model.tied_head", {"models/gpt/gpt_spec.cpp", "config.tied_head"}},
    {"model.micro_batch", {"models/training/gpt_trainer.cpp", "config_.model.micro_batch"}},
    {"model.grad_accumulation",
     {"models/training/gpt_trainer.cpp", "config.model.grad_accumulation"}},
};

std::filesystem::path source(const std::string& relative) {
  return std::filesystem::path(STRATA_SOURCE_DIR) / relative;
}

std::string read_text(const std::string& relative) {
  std::ifstream file(source(relative));
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

// "section.key" of every row of docs/config.md's tables (as config_docs_test.cpp reads them).
std::set<std::string> documented_keys() {
  std::ifstream docs(source("docs/config.md"));
  EXPECT_TRUE(docs.good()) << "docs/config.md is missing";
  const std::regex heading(R"(^## \[([a-z._]+)\]\s*$)");
  const std::regex row(R"(^\| `([a-z_0-9]+)` \|)");
  std::set<std::string> keys;
  std::string section;
  std::string line;
  std::smatch match;
  while (std::getline(docs, line)) {
    if (std::regex_match(line, match, heading)) {
      section = match[1];
    } else if (!section.empty() && std::regex_search(line, match, row)) {
      keys.insert(section + "." + std::string(match[1]));
    }
  }
  return keys;
}

TEST(ConfigConsumers, EveryDocumentedKeyNamesItsConsumer) {
  const std::set<std::string> keys = documented_keys();
  EXPECT_GT(keys.size(), 50u);
  for (const std::string& key : keys) {
    EXPECT_TRUE(kConsumers.contains(key))
        << key << " is documented in docs/config.md but no consumer is listed for it here";
  }
  for (const auto& [key, consumer] : kConsumers) {
    EXPECT_TRUE(keys.contains(key)) << key << " is listed here but not documented";
  }
}

TEST(ConfigConsumers, EveryConsumerReadsItsKey) {
  for (const auto& [key, consumer] : kConsumers) {
    ASSERT_TRUE(std::filesystem::is_regular_file(source(consumer.file)))
        << key << ": consumer " << consumer.file << " is missing";
    EXPECT_NE(read_text(consumer.file).find(consumer.reads), std::string::npos)
        << key << ": " << consumer.file << " no longer reads it (\"" << consumer.reads << "\")";
  }
}

// The loader's own reads do not count: config.cpp parses, it does not consume (parameter_count
// is the one consumer there, and it is named by its expression).
TEST(ConfigConsumers, NoKeyIsConsumedOnlyByTheLoader) {
  for (const auto& [key, consumer] : kConsumers) {
    EXPECT_NE(std::string(consumer.file), "runtime/config/config_reader.cpp") << key;
    if (std::string(consumer.file) == "runtime/config/config.cpp") {
      EXPECT_EQ(key, "model.params") << key << " is only read by the loader";
    }
  }
}

}  // namespace
}  // namespace strata

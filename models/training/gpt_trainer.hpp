// GptTrainer: fine-tunes the built-in GPT (models/gpt) through strata's ZeRO-3 Engine. The model owns no
// parameters: every unit is gathered from wherever the config homes it (device, host, NVMe) just
// before its forward and again for its backward, and its gradient goes straight to reduce_grads.
// Used by `strata-finetune` and by the tests.
//
// On a CUDA device the model runs there too (cuBLAS and kernels): the gathered views are device
// memory, the gradient buffer is allocated on the device (within its budget) and reduce_grads
// receives device spans; the batch's tokens go to the device in GptModel::set_batch.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <vector>

#include "models/gpt/byte_corpus.hpp"
#include "models/gpt/gpt_model.hpp"
#include "models/training/unit_passes.hpp"
#include "runtime/config/config.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/engine/trace.hpp"
#include "tiers/device/device.hpp"
namespace strata::runtime::comm {
class Communicator;
}

namespace strata::examples {

struct TrainerOptions {
  std::vector<std::filesystem::path>
      data;                        // empty: the licence texts under /usr/share/common-licenses
  std::uint32_t eval_batches = 4;  // validation batches per evaluation
  bool resume = false;             // continue from the NVMe store's committed step
  bool overwrite = false;          // start afresh even over a committed store (EngineOptions)
  runtime::Tracer* tracer = nullptr;
  UnitCalls unit_calls = UnitCalls::kAuto;  // asynchronous on CUDA (unit_passes.hpp)
};

class GptTrainer {
 public:
  GptTrainer(const runtime::Config& config, tiers::Device& device,
             runtime::comm::Communicator& comm, const TrainerOptions& options);

  // Weights from a safetensors file (tensor names as docs/gpt.md lists them); optimizer moments
  // restart from zero. Throws gpt::SafetensorsError naming the file and tensor on any mismatch.
  void load_weights(const std::filesystem::path& path);
  // Every unit's full fp32 weights, gathered from all ranks, as one safetensors file (rank 0
  // writes; every rank must call).
  void export_weights(const std::filesystem::path& path, DType dtype);
  // The whole training state from a checkpoint (Engine::load: weights, optimizer moments, step,
  // loss scale); the data order goes on from that step. Collective.
  void load_checkpoint(const std::filesystem::path& dir);

  StepReport train_step();
  // Whether the passes run asynchronous unit calls (TrainerOptions::unit_calls).
  bool asynchronous_unit_calls() const { return fence_ != nullptr; }
  // Mean loss over the fixed validation batches (forward only).
  double validation_loss();

  runtime::Engine& engine() { return *engine_; }
  const gpt::GptModel& model() const { return model_; }
  const gpt::Corpus& corpus() const { return corpus_; }
  std::uint64_t parameter_count() const { return model_.parameter_count(); }

 private:
  // Forward of every unit over `tokens`; returns the loss. Keeps activations for backward.
  double forward(std::span<const std::int32_t> tokens, StepReport* report);
  UnitPasses<gpt::GptModel> passes();
  void position_sampler();  // at the Engine's step

  runtime::Config config_;
  runtime::comm::Communicator* comm_;
  TrainerOptions options_;
  gpt::GptModel model_;
  tiers::ImmediateFence immediate_fence_;  // UnitCalls::kAsynchronous on the host
  tiers::ComputeFence* fence_ = nullptr;   // the model's, or immediate_fence_; null: synchronous
  gpt::Corpus corpus_;
  std::unique_ptr<runtime::Engine> engine_;
  std::vector<runtime::UnitId> units_;
  std::optional<gpt::BatchSampler> sampler_;
  std::vector<std::int32_t> batch_;
  std::optional<UnitGradBuffer> grads_;  // emplaced before the Engine takes the rest of the budget
};

}  // namespace strata::examples

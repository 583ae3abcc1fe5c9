// LlmTrainer: fine-tunes a Hugging Face decoder (Llama, Mistral, Qwen2, GPT-2; decoder_model.hpp)
// through strata's ZeRO-3 Engine, as GptTrainer does the built-in GPT: one Engine unit per
// decoder unit; each unit is gathered from wherever the config homes it just before its forward
// and again for its backward, and its gradient goes straight to reduce_grads. The model computes
// where the Engine's device is: fp32 on the host device, or on a CUDA device with bf16
// tensor-core products (decoder_cuda.hpp), gradients then staying in device memory.
//
// Weights come from the model folder (HfCheckpoint, each rank reading its share of each unit);
// data from text / JSONL files (training_data.hpp) packed into seq_len + 1 windows with loss
// weights; the training order is a pure function of the seed and the step, so --resume continues
// at the same batch. export_hf() writes a folder transformers loads (hf_export.hpp).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <vector>

#include "models/training/data_loader.hpp"
#include "models/decoder/decoder_model.hpp"
#include "models/decoder/hf_config.hpp"
#include "models/checkpoint/hf_export.hpp"
#include "models/tokenizer/tokenizer.hpp"
#include "models/training/unit_passes.hpp"
#include "runtime/config/config.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/engine/trace.hpp"
#include "tiers/device/compute_fence.hpp"
#include "tiers/device/device.hpp"

namespace strata::tiers {
class Device;
}
namespace strata::runtime::comm {
class Communicator;
}

namespace strata::llm {

struct LlmTrainerOptions {
  std::filesystem::path model_dir;            // config.json, tokenizer, safetensors
  std::vector<std::filesystem::path> data;    // files or folders (training_data.hpp)
  std::uint32_t seq_len = 128;                // positions per sequence
  std::uint32_t micro_batch = 1;              // sequences per micro-batch
  std::uint32_t grad_accumulation = 1;        // micro-batches per optimizer step
  std::uint32_t eval_batches = 4;             // at most this many validation batches
  bool activation_checkpointing = false;
  // Packed documents attend only within themselves, positions restarting at each (the decoder's
  // document_separator, with the eos that separates documents).
  bool document_mask = false;
  CudaAttention cuda_attention = CudaAttention::kAuto;  // DecoderOptions::cuda_attention
  // How the passes call the model (unit_passes.hpp's UnitCalls): by default asynchronously on
  // CUDA, synchronously on the host.
  using UnitCalls = examples::UnitCalls;
  UnitCalls unit_calls = UnitCalls::kAuto;
  bool load_weights = true;                   // false: the Engine's seeded initialisation
  bool resume = false;                        // continue from the NVMe store's committed step
  bool overwrite = false;                     // start afresh even over a committed store
  runtime::Tracer* tracer = nullptr;
};

class LlmTrainer {
 public:
  // Throws HfConfigError, TokenizerError, CheckpointError, DataError (each naming its file) on
  // bad inputs, before the first step.
  LlmTrainer(const runtime::Config& config, tiers::Device& device,
             runtime::comm::Communicator& comm, const LlmTrainerOptions& options);
  ~LlmTrainer();

  examples::StepReport train_step();
  // Weighted mean loss over the first eval_batches validation batches (forward only).
  double validation_loss();
  // Every rank calls (the gathers are collective); rank 0 writes.
  void export_hf(const std::filesystem::path& out_dir, const ExportOptions& options);

  runtime::Engine& engine() { return *engine_; }
  const DecoderModel& model() const { return *model_; }
  // Whether the passes run asynchronous unit calls (LlmTrainerOptions::unit_calls).
  bool asynchronous_unit_calls() const { return fence_ != nullptr; }
  const HfConfig& hf_config() const { return hf_config_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const DataLoader& data() const { return *data_; }
  std::uint64_t data_tokens() const { return data_tokens_; }
  bool gpt2_prefix_stripped() const { return gpt2_prefix_stripped_; }

 private:
  double forward(const Batch& batch, examples::StepReport* report);
  examples::UnitPasses<DecoderModel> passes();

  runtime::Config config_;
  runtime::comm::Communicator* comm_;
  LlmTrainerOptions options_;
  HfConfig hf_config_;
  std::optional<Tokenizer> tokenizer_;
  std::unique_ptr<DecoderModel> model_;
  tiers::ImmediateFence immediate_fence_;  // UnitCalls::kAsynchronous on the host
  tiers::ComputeFence* fence_ = nullptr;   // the model's, or immediate_fence_; null: synchronous
  std::unique_ptr<DataLoader> data_;
  std::uint64_t data_tokens_ = 0;
  bool gpt2_prefix_stripped_ = false;
  std::unique_ptr<runtime::Engine> engine_;
  std::vector<runtime::UnitId> units_;
  std::optional<examples::UnitGradBuffer> grads_;  // emplaced before the Engine finalizes
  Batch batch_;
};

}  // namespace strata::llm

// `strata-finetune --model HF_DIR`: fine-tunes a Hugging Face model folder through the ZeRO-3
// Engine (models/training/llm_trainer.hpp) with the TOML's [tiers], [zero], [optimizer] and
// [precision]; sequence length, micro-batch and accumulation from [model] unless the command line
// gives them. Prints the plan, one progress line per step, validation losses and a summary, then
// exports a folder transformers loads. [checkpoint] and [trace] as for the built-in GPT
// (training_run.hpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "models/decoder/decoder_model.hpp"
#include "runtime/config/config.hpp"

namespace strata::examples {

struct HfFinetuneOptions {
  std::string model_dir;
  std::vector<std::string> data;
  std::uint32_t steps = 100;
  std::optional<std::uint32_t> seq_len;
  std::optional<std::uint32_t> micro_batch;
  std::optional<std::uint32_t> grad_accumulation;
  bool activation_checkpointing = false;
  bool document_mask = false;  // packed documents attend only within themselves
  std::string export_dir;
  DType export_dtype = DType::kBf16;
  std::uint64_t max_shard_bytes = 5'000'000'000;
  std::uint32_t eval_every = 25;  // 0: only at the start and the end
  std::uint32_t eval_batches = 4;
  std::uint32_t blas_threads = 0;
  // host, cuda (each rank's local-rank GPU, or [tiers.device] index) or auto, as for the GPT.
  runtime::DeviceKind device = runtime::DeviceKind::kHost;
  llm::CudaAttention attention = llm::CudaAttention::kAuto;  // the decoder's CUDA attention
  bool synchronous_unit_calls = false;  // LlmTrainerOptions::UnitCalls::kSynchronous
  bool resume = false;
  bool overwrite = false;
  std::string resume_from;  // a checkpoint to continue from (Engine::load); empty: none
  std::string trace;        // Chrome trace output ([trace] path or --trace); empty: none
  std::string summary_json;
  bool profile = false;  // --profile
};

// The process exit code: 0, 2 (bad config or device placement), 3 (does not fit).
int run_hf_finetune(runtime::Config config, const HfFinetuneOptions& options);

}  // namespace strata::examples

#include "models/training/llm_trainer.hpp"

#include <algorithm>
#include <exception>
#include <utility>
#include <vector>

#include "models/checkpoint/hf_checkpoint.hpp"
#include "models/training/training_data.hpp"
#include "models/checkpoint/weights_loader.hpp"
#include "runtime/comm/communicator.hpp"
#include "tiers/device/device.hpp"

namespace strata::llm {
namespace {

std::int32_t eos_of(const HfConfig& config, const Tokenizer& tokenizer) {
  if (!config.eos_token_ids.empty()) return config.eos_token_ids.front();
  if (const auto eos = tokenizer.eos_id()) return *eos;
  throw DataError(config.source.string() +
                  ": no eos_token_id, and the tokenizer names no eos token: documents cannot "
                  "be separated");
}

}  // namespace

LlmTrainer::LlmTrainer(const runtime::Config& config, tiers::Device& device,
                       runtime::comm::Communicator& comm, const LlmTrainerOptions& options)
    : config_(config), comm_(&comm), options_(options) {
  hf_config_ = read_hf_config(options.model_dir / "config.json");
  tokenizer_.emplace(Tokenizer::load(options.model_dir));
  const DataSource source{&*tokenizer_, hf_config_.family, eos_of(hf_config_, *tokenizer_)};
  DecoderOptions decoder_options;
  decoder_options.seq_len = options.seq_len;
  decoder_options.micro_batch = options.micro_batch;
  decoder_options.activation_checkpointing = options.activation_checkpointing;
  decoder_options.cuda_attention = options.cuda_attention;
  if (options.document_mask) decoder_options.document_separator = source.eos_id;
  model_ = std::make_unique<DecoderModel>(hf_config_, decoder_options, &device);
  fence_ = examples::unit_call_fence(*model_, options.unit_calls, immediate_fence_);

  const TokenStream stream = read_training_data(options.data, source);
  data_tokens_ = stream.size();
  if (stream.size() < 2) {
    throw DataError("the training data holds " + std::to_string(stream.size()) +
                    " token(s); at least 2 are needed");
  }
  data_ = std::make_unique<DataLoader>(
      pack_windows(stream, std::size_t{options.seq_len} + 1, source.eos_id), options.micro_batch,
      config.run.seed, static_cast<std::uint32_t>(comm.size()),
      static_cast<std::uint32_t>(comm.rank()));

  std::optional<HfCheckpoint> checkpoint;
  if (options.load_weights) {
    checkpoint.emplace(HfCheckpoint::open(options.model_dir));
    checkpoint->check(model_->units());  // before anything is allocated
    gpt2_prefix_stripped_ = checkpoint->gpt2_prefix_stripped();
  }
  runtime::EngineOptions engine_options;
  engine_options.grad_accumulation = options.grad_accumulation;
  engine_options.resume = options.resume;
  engine_options.overwrite = options.overwrite;
  engine_options.tracer = options.tracer;
  std::size_t largest = 0;
  for (const UnitSpec& unit : model_->units()) largest = std::max(largest, unit.numel);
  // The model's device memory (activations above, this gradient) is taken before the Engine
  // finalizes, so the gathered units it caches fill only what is left of the budget; the memory
  // plan counts both (model_plan.hpp's plan_inputs).
  // Two slots with asynchronous calls: a unit's backward writes one while the unit before is
  // reduced from the other.
  grads_.emplace(device, largest, fence_ != nullptr ? 2 : 1);
  engine_ = std::make_unique<runtime::Engine>(config, device, comm, engine_options);
  engine_->set_compute_fence(fence_);  // (model_ outlives engine_: declared before it)
  for (std::size_t u = 0; u < model_->units().size(); ++u) {
    // The tensors the model reads in bf16 alone get no fp32 view (CUDA's bf16 path: no cast).
    runtime::UnitSpec unit = engine_unit(model_->units()[u]);
    const std::vector<bool> fp32_read = model_->fp32_views_read(u);
    for (std::size_t t = 0; t < unit.tensors.size(); ++t) unit.tensors[t].fp32_view = fp32_read[t];
    units_.push_back(engine_->add_unit(std::move(unit)));
  }
  engine_->finalize();
  // A resumed run continues from the store's weights, not the folder's.
  if (checkpoint && engine_->step_count() == 0) {
    load_units(*checkpoint, model_->units(), comm,
               [this](std::size_t unit, std::span<const float> values) {
                 engine_->set_master(units_[unit], values);
               });
  }
}

LlmTrainer::~LlmTrainer() = default;

examples::UnitPasses<DecoderModel> LlmTrainer::passes() {
  return {*model_, *engine_, units_, options_.tracer, fence_};
}

double LlmTrainer::forward(const Batch& batch, examples::StepReport* report) {
  model_->set_batch(batch.tokens, data_->window_tokens(), batch.weights);
  return passes().forward(report);
}

examples::StepReport LlmTrainer::train_step() {
  // The training order is a pure function of the step: a resumed run goes on at the same batch.
  const std::uint64_t first_index = engine_->step_count() * options_.grad_accumulation;
  return examples::train_step(passes(), *grads_, *comm_, options_.grad_accumulation,
                              [&](std::uint32_t m) {
                                data_->train_batch(first_index + m, batch_);
                                model_->set_batch(batch_.tokens, data_->window_tokens(),
                                                  batch_.weights);
                                return std::uint64_t{batch_.sequences} *
                                       (data_->window_tokens() - 1);
                              });
}

double LlmTrainer::validation_loss() {
  const std::size_t batches =
      std::min<std::size_t>(std::max<std::uint32_t>(1, options_.eval_batches),
                            data_->validation_batch_count());
  double loss_sum = 0;
  double weight_sum = 0;
  for (std::size_t b = 0; b < batches; ++b) {
    data_->validation_batch(b, batch_);
    forward(batch_, nullptr);
    loss_sum += model_->loss_sum();
    weight_sum += model_->loss_weight();
  }
  return weight_sum > 0 ? loss_sum / weight_sum : 0.0;
}

void LlmTrainer::export_hf(const std::filesystem::path& out_dir, const ExportOptions& options) {
  ExportOptions resolved = options;
  resolved.gpt2_prefix_stripped = gpt2_prefix_stripped_;
  std::optional<HfExportWriter> writer;
  std::exception_ptr failure;
  if (comm_->rank() == 0) {
    try {
      prepare_export_folder(options_.model_dir, out_dir);
      writer.emplace(out_dir, model_->units(), resolved);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  // Every rank learns of rank 0's failure before the collective gathers, instead of waiting in them.
  if (comm_->any_rank(failure != nullptr)) {
    if (failure) std::rethrow_exception(failure);
    throw CheckpointError("export to " + out_dir.string() + " failed on rank 0");
  }
  for (std::size_t u = 0; u < units_.size(); ++u) {
    const std::vector<float> values = engine_->gather_master(units_[u]);
    if (writer) writer->write_unit(u, values);
  }
  if (writer) writer->finish();
  comm_->barrier();
}

}  // namespace strata::llm

#include "models/training/gpt_trainer.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "models/gpt/gpt_spec.hpp"
#include "models/gpt/safetensors.hpp"
#include "runtime/comm/communicator.hpp"

namespace strata::examples {
namespace {

runtime::UnitSpec to_engine_unit(const gpt::UnitSpec& unit) {
  runtime::UnitSpec spec;
  spec.name = unit.name;
  for (const gpt::TensorSpec& tensor : unit.tensors) {
    runtime::TensorSpec engine_tensor;
    engine_tensor.name = tensor.name;
    engine_tensor.shape.assign(tensor.shape.begin(), tensor.shape.end());
    engine_tensor.weight_decay = tensor.weight_decay;
    switch (tensor.init) {
      case gpt::InitKind::kNormal:
        engine_tensor.init = runtime::TensorInit::normal(tensor.init_std);
        break;
      case gpt::InitKind::kZeros:
        engine_tensor.init = runtime::TensorInit::zeros();
        break;
      case gpt::InitKind::kOnes:
        engine_tensor.init = runtime::TensorInit::ones();
        break;
    }
    spec.tensors.push_back(std::move(engine_tensor));
  }
  return spec;
}

}  // namespace

GptTrainer::GptTrainer(const runtime::Config& config, tiers::Device& device,
                       runtime::comm::Communicator& comm, const TrainerOptions& options)
    : config_(config), comm_(&comm), options_(options), model_(config.model, &device) {
  fence_ = unit_call_fence(model_, options.unit_calls, immediate_fence_);
  gpt::CorpusOptions corpus_options;
  corpus_options.min_split_bytes = std::size_t{config.model.seq_len} + 1;
  corpus_ = options.data.empty() ? gpt::load_default_corpus(corpus_options)
                                 : gpt::load_corpus(options.data, corpus_options);
  runtime::EngineOptions engine_options;
  engine_options.grad_accumulation = config.model.grad_accumulation;
  engine_options.resume = options.resume;
  engine_options.overwrite = options.overwrite;
  engine_options.tracer = options.tracer;
  std::size_t largest = 0;
  for (const gpt::UnitSpec& unit : model_.units()) largest = std::max(largest, unit.numel);
  // The model's device memory first, then the Engine caches gathered units in what is left (the
  // memory plan counts both: finetune_main.cpp).
  grads_.emplace(device, largest, fence_ != nullptr ? 2 : 1);  // two slots: unit_passes.hpp
  engine_ = std::make_unique<runtime::Engine>(config, device, comm, engine_options);
  engine_->set_compute_fence(fence_);  // (model_ outlives engine_: declared before it)
  for (const gpt::UnitSpec& unit : model_.units()) units_.push_back(engine_->add_unit(to_engine_unit(unit)));
  engine_->finalize();
  batch_.resize(model_.batch_tokens());
  position_sampler();
}

// Each rank draws its own batches (data parallelism); the seed fixes them all. A resumed or loaded
// run skips the batches the steps before it consumed, so it goes on at the same batch.
void GptTrainer::position_sampler() {
  sampler_.emplace(corpus_.train, config_.model.seq_len, config_.model.micro_batch,
                   config_.run.seed * 1000 + static_cast<std::uint64_t>(comm_->rank()));
  for (std::uint64_t i = 0; i < engine_->step_count() * config_.model.grad_accumulation; ++i) {
    sampler_->next(batch_);
  }
}

void GptTrainer::load_checkpoint(const std::filesystem::path& dir) {
  engine_->load(dir);
  position_sampler();
}

UnitPasses<gpt::GptModel> GptTrainer::passes() {
  return {model_, *engine_, units_, options_.tracer, fence_};
}

double GptTrainer::forward(std::span<const std::int32_t> tokens, StepReport* report) {
  model_.set_batch(tokens);
  return passes().forward(report);
}

StepReport GptTrainer::train_step() {
  return examples::train_step(passes(), *grads_, *comm_, config_.model.grad_accumulation,
                              [this](std::uint32_t) {
                                sampler_->next(batch_);
                                model_.set_batch(batch_);
                                return std::uint64_t{config_.model.micro_batch} *
                                       config_.model.seq_len;
                              });
}

double GptTrainer::validation_loss() {
  const std::uint32_t seq_len = config_.model.seq_len;
  const std::size_t windows = gpt::evaluation_windows(corpus_.validation.size(), seq_len);
  const std::uint32_t batches = std::max<std::uint32_t>(
      1,
      std::min<std::uint32_t>(options_.eval_batches,
                              static_cast<std::uint32_t>(windows / config_.model.micro_batch + 1)));
  double total = 0;
  for (std::uint32_t b = 0; b < batches; ++b) {
    gpt::evaluation_batch(corpus_.validation, seq_len, config_.model.micro_batch, b, batch_);
    total += forward(batch_, nullptr);
  }
  return total / batches;
}

void GptTrainer::load_weights(const std::filesystem::path& path) {
  gpt::load_safetensors(path, model_.units(),
                        [this](std::size_t index, std::span<const float> values) {
                          engine_->set_master(units_[index], values);
                        });
}

void GptTrainer::export_weights(const std::filesystem::path& path, DType dtype) {
  // Every rank takes part in the gathers; rank 0 writes.
  std::vector<std::vector<float>> units;
  for (runtime::UnitId unit : units_) units.push_back(engine_->gather_master(unit));
  if (comm_->rank() != 0) return;
  gpt::save_safetensors(
      path, model_.units(),
      [&units](std::size_t index) { return std::span<const float>(units[index]); }, dtype,
      {{"format", "pt"},
       {"producer", "strata-finetune"},
       {"step", std::to_string(engine_->step_count())}});
}

}  // namespace strata::examples

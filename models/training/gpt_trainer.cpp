#include "models/training/gpt_trainer.hpp"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "models/gpt/gpt_spec.hpp"
#include "models/gpt/safetensors.hpp"
#include "runtime/comm/communicator.hpp"

namespace strata::examples {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

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

std::vector<std::span<const float>> views_of(const runtime::GatheredUnit& unit) {
  std::vector<std::span<const float>> views;
  for (std::size_t i = 0; i < unit.tensor_count(); ++i) views.push_back(unit.tensor(i));
  return views;
}

}  // namespace

GptTrainer::GptTrainer(const runtime::Config& config, tiers::Device& device,
                       runtime::comm::Communicator& comm, const TrainerOptions& options)
    : config_(config), comm_(&comm), options_(options), model_(config.model, &device) {
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
  if (device.kind() == tiers::DeviceKind::kCuda) {
    device_grads_ = device.allocate(largest * sizeof(float));
    grad_buffer_ = std::span<float>(device_grads_.span().as<float>(), largest);
    grad_stream_.emplace(device.create_stream());
  } else {
    grads_.resize(largest);
    grad_buffer_ = grads_;
  }
  engine_ = std::make_unique<runtime::Engine>(config, device, comm, engine_options);
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

double GptTrainer::forward(std::span<const std::int32_t> tokens, StepReport* report) {
  model_.set_batch(tokens);
  for (std::size_t u = 0; u < units_.size(); ++u) {
    const auto wait_start = Clock::now();
    runtime::GatheredUnit unit = engine_->gather(units_[u]);
    std::optional<runtime::GatheredUnit> embedding;
    if (model_.units()[u].reads_embedding) embedding.emplace(engine_->gather(units_[0]));
    const auto compute_start = Clock::now();
    if (report != nullptr)
      report->gather_wait_s += std::chrono::duration<double>(compute_start - wait_start).count();
    const std::vector<std::span<const float>> views = views_of(unit);
    std::vector<std::span<const float>> shared;
    if (embedding) shared = views_of(*embedding);
    {
      runtime::Tracer::Scope scope(options_.tracer, runtime::TraceTrack::kCompute,
                                   "forward " + model_.units()[u].name);
      model_.forward_unit(u, views, shared);
    }
    if (report != nullptr) report->compute_s += since(compute_start);
  }
  return model_.loss();
}

void GptTrainer::backward(StepReport& report, float gradient_scale) {
  for (std::size_t u = units_.size(); u-- > 0;) {
    const gpt::UnitSpec& spec = model_.units()[u];
    const auto wait_start = Clock::now();
    runtime::GatheredUnit unit = engine_->gather(units_[u]);
    std::optional<runtime::GatheredUnit> embedding;
    if (spec.reads_embedding) embedding.emplace(engine_->gather(units_[0]));
    const auto compute_start = Clock::now();
    report.gather_wait_s += std::chrono::duration<double>(compute_start - wait_start).count();
    const std::vector<std::span<const float>> views = views_of(unit);
    std::vector<std::span<const float>> shared;
    if (embedding) shared = views_of(*embedding);
    const std::span<float> grads = grad_buffer_.first(spec.numel);
    {
      runtime::Tracer::Scope scope(options_.tracer, runtime::TraceTrack::kCompute,
                                   "backward " + spec.name);
      model_.backward_unit(u, views, gpt::split_unit(spec, grads), shared);
      if (gradient_scale != 1.0f) {
        if (grad_stream_) {
          grad_stream_->scale({reinterpret_cast<std::byte*>(grads.data()), grads.size_bytes()},
                              gradient_scale);
          grad_stream_->synchronize();
        } else {
          for (float& g : grads) g *= gradient_scale;
        }
      }
    }
    report.compute_s += since(compute_start);
    embedding.reset();
    const auto grads_start = Clock::now();
    engine_->reduce_grads(units_[u], grads);
    report.grads_s += since(grads_start);
  }
}

StepReport GptTrainer::train_step() {
  const auto start = Clock::now();
  StepReport report;
  const std::uint32_t micro_batches = config_.model.grad_accumulation;
  // Gradients are summed over micro-batches: scale each by 1/micro_batches for the mean, and by
  // the loss scale for fp16 (the Engine divides it out again before the update).
  const float scale = static_cast<float>(engine_->loss_scale() / micro_batches);
  for (std::uint32_t m = 0; m < micro_batches; ++m) {
    sampler_->next(batch_);
    report.loss += forward(batch_, &report) / micro_batches;
    backward(report, scale);
    report.tokens += std::uint64_t{config_.model.micro_batch} * config_.model.seq_len;
  }
  // Each rank's loss covers its part of the global batch: the line printed is the mean over ranks.
  if (comm_->size() > 1) {
    report.loss =
        comm_->all_reduce_f32(static_cast<float>(report.loss), runtime::comm::ReduceOp::kAvg);
  }
  {
    runtime::Tracer::Scope scope(options_.tracer, runtime::TraceTrack::kOptimizer, "step");
    report.optimizer = engine_->step();
  }
  report.step = report.optimizer.step;
  report.total_s = since(start);
  return report;
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

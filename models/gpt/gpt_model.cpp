#include "models/gpt/gpt_model.hpp"

#include <cblas.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <thread>

#include "base/assert.hpp"
#include "models/gpt/gpt_cuda.hpp"
#include "models/gpt/kernels.hpp"
#include "tiers/device/device.hpp"

namespace strata::gpt {

using detail::Accumulate;
using detail::Transpose;

void set_blas_threads(std::uint32_t threads) {
  if (threads == 0) {
    threads = std::max(1u, std::thread::hardware_concurrency());
  }
  openblas_set_num_threads(static_cast<int>(threads));
}

std::uint32_t blas_threads() {
  return static_cast<std::uint32_t>(openblas_get_num_threads());
}

GptModel::GptModel(const runtime::ModelConfig& config, tiers::Device* device)
    : config_(config), units_(gpt_units(config)) {
  if (config.micro_batch == 0) {
    throw std::invalid_argument("GPT model: micro_batch must be positive");
  }
  const std::size_t rows = std::size_t{config.micro_batch} * config.seq_len;
  inputs_.resize(rows);
  targets_.resize(rows);
  if (device != nullptr && device->kind() == tiers::DeviceKind::kCuda) {
#if STRATA_HAVE_CUDA
    cuda_ = detail::make_cuda_gpt(config, *device);
    return;
#else
    throw std::invalid_argument("GPT model: this build has no CUDA, so it cannot run on " +
                                device->name());
#endif
  }
  const std::size_t d = config.d_model;
  const std::size_t prob =
      std::size_t{config.micro_batch} * config.heads * config.seq_len * config.seq_len;
  resid_.assign(config.layers + 1, std::vector<float>(rows * d));
  blocks_.resize(config.layers);
  for (BlockActivations& block : blocks_) {
    block.ln1_out.resize(rows * d);
    block.ln1_mean.resize(rows);
    block.ln1_rstd.resize(rows);
    block.qkv.resize(rows * 3 * d);
    block.prob.resize(prob);
    block.att_out.resize(rows * d);
    block.resid_mid.resize(rows * d);
    block.ln2_out.resize(rows * d);
    block.ln2_mean.resize(rows);
    block.ln2_rstd.resize(rows);
    block.fc_pre.resize(rows * 4 * d);
    block.fc_tanh.resize(rows * 4 * d);
    block.fc_act.resize(rows * 4 * d);
  }
  lnf_out_.resize(rows * d);
  lnf_mean_.resize(rows);
  lnf_rstd_.resize(rows);
  logits_.resize(rows * config.vocab);
  dlogits_.resize(rows * config.vocab);
  d_resid_.resize(rows * d);
  d_norm_.resize(rows * d);
  d_att_.resize(rows * d);
  d_qkv_.resize(rows * 3 * d);
  d_fc_.resize(rows * 4 * d);
  attention_scratch_.resize(prob);
  if (config.tied_head) {
    tied_wte_grad_.resize(std::size_t{config.vocab} * d);
  }
}

GptModel::~GptModel() = default;
GptModel::GptModel(GptModel&&) noexcept = default;
GptModel& GptModel::operator=(GptModel&&) noexcept = default;

std::size_t GptModel::parameter_count() const {
  std::size_t count = 0;
  for (const UnitSpec& unit : units_) {
    count += unit.numel;
  }
  return count;
}

std::size_t GptModel::batch_tokens() const {
  return std::size_t{config_.micro_batch} * (config_.seq_len + 1);
}

tiers::ComputeFence* GptModel::enable_asynchronous_calls() {
  return cuda_ ? cuda_->enable_asynchronous_calls() : nullptr;
}

std::size_t GptModel::activation_bytes() const {
  if (cuda_) {
    return cuda_->activation_bytes();
  }
  std::size_t floats = 0;
  for (const std::vector<float>& stream : resid_) {
    floats += stream.size();
  }
  for (const BlockActivations& a : blocks_) {
    for (const std::vector<float>* v :
         {&a.ln1_out, &a.ln1_mean, &a.ln1_rstd, &a.qkv, &a.prob, &a.att_out, &a.resid_mid,
          &a.ln2_out, &a.ln2_mean, &a.ln2_rstd, &a.fc_pre, &a.fc_tanh, &a.fc_act}) {
      floats += v->size();
    }
  }
  for (const std::vector<float>* v :
       {&lnf_out_, &lnf_mean_, &lnf_rstd_, &logits_, &dlogits_, &d_resid_, &d_norm_, &d_att_,
        &d_qkv_, &d_fc_, &attention_scratch_, &tied_wte_grad_}) {
    floats += v->size();
  }
  return floats * sizeof(float) + (inputs_.size() + targets_.size()) * sizeof(std::int32_t);
}

std::span<const float> GptModel::logits() const {
  if (cuda_) {
    cuda_->copy_logits(cuda_logits_);
    return cuda_logits_;
  }
  return std::span<const float>(logits_).first(rows_ * config_.vocab);
}

void GptModel::set_batch(std::span<const std::int32_t> tokens) {
  const std::size_t span = config_.seq_len + 1;
  STRATA_ASSERT(!tokens.empty() && tokens.size() % span == 0 && tokens.size() <= batch_tokens(),
                "set_batch wants 1 .. micro_batch sequences of seq_len + 1 tokens");
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || static_cast<std::uint32_t>(tokens[i]) >= config_.vocab) {
      throw std::out_of_range("GPT batch: token " + std::to_string(tokens[i]) + " at position " +
                              std::to_string(i) + " is outside the vocabulary [0, " +
                              std::to_string(config_.vocab) + ")");
    }
  }
  sequences_ = tokens.size() / span;
  rows_ = sequences_ * config_.seq_len;
  for (std::size_t s = 0; s < sequences_; ++s) {
    for (std::size_t t = 0; t < config_.seq_len; ++t) {
      inputs_[s * config_.seq_len + t] = tokens[s * span + t];
      targets_[s * config_.seq_len + t] = tokens[s * span + t + 1];
    }
  }
  if (cuda_) {
    cuda_->set_batch(std::span(inputs_).first(rows_), std::span(targets_).first(rows_), sequences_);
  }
  phase_ = Phase::kForward;
  next_unit_ = 0;
}

void GptModel::check_unit_views(std::size_t unit, UnitParams params, UnitParams shared) const {
  STRATA_ASSERT(unit < units_.size());
  const UnitSpec& spec = units_[unit];
  STRATA_ASSERT(params.size() == spec.tensors.size(), "one span per tensor of the unit");
  for (std::size_t i = 0; i < params.size(); ++i) {
    STRATA_ASSERT(params[i].size() == spec.tensors[i].numel(), "parameter span of the wrong size");
  }
  if (spec.reads_embedding) {
    STRATA_ASSERT(shared.size() == units_[0].tensors.size(), "tied head needs the embedding unit");
    STRATA_ASSERT(shared[kTokenEmbedding].size() == units_[0].tensors[kTokenEmbedding].numel());
  } else {
    STRATA_ASSERT(shared.empty(), "only the tied head reads another unit");
  }
}

void GptModel::forward_unit(std::size_t unit, UnitParams params, UnitParams shared) {
  STRATA_ASSERT(phase_ == Phase::kForward && unit == next_unit_, "forward units in order");
  check_unit_views(unit, params, shared);
  const UnitSpec& spec = units_[unit];
  switch (spec.kind) {
    case UnitKind::kEmbedding:
      cuda_ ? cuda_->forward_embedding(params) : forward_embedding(params);
      break;
    case UnitKind::kBlock:
      cuda_ ? cuda_->forward_block(spec.layer, params) : forward_block(spec.layer, params);
      break;
    case UnitKind::kHead:
      cuda_ ? cuda_->forward_head(params, shared) : forward_head(params, shared);
      break;
  }
  ++next_unit_;
}

double GptModel::loss() {
  STRATA_ASSERT(phase_ == Phase::kForward && next_unit_ == units_.size(),
                "loss after the last unit's forward");
  const double mean = cuda_ ? cuda_->loss()
                            : detail::cross_entropy(logits_.data(), targets_.data(),
                                                    dlogits_.data(), rows_, config_.vocab);
  phase_ = Phase::kBackward;
  next_unit_ = units_.size();
  return mean;
}

void GptModel::backward_unit(std::size_t unit, UnitParams params, UnitGrads grads,
                             UnitParams shared) {
  STRATA_ASSERT(phase_ == Phase::kBackward && unit + 1 == next_unit_,
                "backward units in reverse order, after loss()");
  check_unit_views(unit, params, shared);
  const UnitSpec& spec = units_[unit];
  STRATA_ASSERT(grads.size() == spec.tensors.size(), "one gradient span per tensor of the unit");
  for (std::size_t i = 0; i < grads.size(); ++i) {
    STRATA_ASSERT(grads[i].size() == spec.tensors[i].numel(), "gradient span of the wrong size");
  }
  switch (spec.kind) {
    case UnitKind::kEmbedding:
      cuda_ ? cuda_->backward_embedding(grads) : backward_embedding(grads);
      break;
    case UnitKind::kBlock:
      cuda_ ? cuda_->backward_block(spec.layer, params, grads)
            : backward_block(spec.layer, params, grads);
      break;
    case UnitKind::kHead:
      cuda_ ? cuda_->backward_head(params, grads, shared) : backward_head(params, grads, shared);
      break;
  }
  --next_unit_;
  if (next_unit_ == 0) {
    phase_ = Phase::kIdle;
  }
}

void GptModel::forward_embedding(UnitParams params) {
  const std::size_t d = config_.d_model;
  const float* wte = params[kTokenEmbedding].data();
  const float* wpe = params[kPositionEmbedding].data();
  float* x = resid_[0].data();
  for (std::size_t row = 0; row < rows_; ++row) {
    const float* token_row = wte + static_cast<std::size_t>(inputs_[row]) * d;
    const float* position_row = wpe + (row % config_.seq_len) * d;
    for (std::size_t i = 0; i < d; ++i) {
      x[row * d + i] = token_row[i] + position_row[i];
    }
  }
}

void GptModel::forward_block(std::size_t layer, UnitParams params) {
  const std::size_t d = config_.d_model;
  const std::size_t rows = rows_;
  BlockActivations& a = blocks_[layer];
  const float* x = resid_[layer].data();
  float* out = resid_[layer + 1].data();

  detail::layernorm_forward(x, params[kLn1Weight].data(), params[kLn1Bias].data(), a.ln1_out.data(),
                            a.ln1_mean.data(), a.ln1_rstd.data(), rows, d);
  detail::linear_forward(a.ln1_out.data(), params[kAttnWeight].data(), params[kAttnBias].data(),
                         a.qkv.data(), rows, d, 3 * d);
  const detail::AttentionShape shape{sequences_, config_.seq_len, config_.heads, d};
  detail::attention_forward(shape, a.qkv.data(), a.prob.data(), a.att_out.data());
  detail::linear_forward(a.att_out.data(), params[kAttnProjWeight].data(),
                         params[kAttnProjBias].data(), a.resid_mid.data(), rows, d, d);
  for (std::size_t i = 0; i < rows * d; ++i) {
    a.resid_mid[i] += x[i];
  }

  detail::layernorm_forward(a.resid_mid.data(), params[kLn2Weight].data(), params[kLn2Bias].data(),
                            a.ln2_out.data(), a.ln2_mean.data(), a.ln2_rstd.data(), rows, d);
  detail::linear_forward(a.ln2_out.data(), params[kFcWeight].data(), params[kFcBias].data(),
                         a.fc_pre.data(), rows, d, 4 * d);
  detail::gelu_forward(a.fc_pre.data(), a.fc_act.data(), a.fc_tanh.data(), rows * 4 * d);
  detail::linear_forward(a.fc_act.data(), params[kMlpProjWeight].data(),
                         params[kMlpProjBias].data(), out, rows, 4 * d, d);
  for (std::size_t i = 0; i < rows * d; ++i) {
    out[i] += a.resid_mid[i];
  }
}

void GptModel::forward_head(UnitParams params, UnitParams shared) {
  const std::size_t d = config_.d_model;
  detail::layernorm_forward(resid_[config_.layers].data(), params[kLnfWeight].data(),
                            params[kLnfBias].data(), lnf_out_.data(), lnf_mean_.data(),
                            lnf_rstd_.data(), rows_, d);
  const float* head =
      config_.tied_head ? shared[kTokenEmbedding].data() : params[kLmHeadWeight].data();
  // logits = lnf_out · headᵀ, head [vocab × d].
  detail::gemm(Transpose::kNo, Transpose::kYes, rows_, config_.vocab, d, 1.0f, lnf_out_.data(), d,
               head, d, 0.0f, logits_.data(), config_.vocab);
}

void GptModel::backward_head(UnitParams params, UnitGrads grads, UnitParams shared) {
  const std::size_t d = config_.d_model;
  const std::size_t vocab = config_.vocab;
  const float* head =
      config_.tied_head ? shared[kTokenEmbedding].data() : params[kLmHeadWeight].data();
  float* dhead = config_.tied_head ? tied_wte_grad_.data() : grads[kLmHeadWeight].data();
  detail::gemm(Transpose::kNo, Transpose::kNo, rows_, d, vocab, 1.0f, dlogits_.data(), vocab, head,
               d, 0.0f, d_norm_.data(), d);
  detail::gemm(Transpose::kYes, Transpose::kNo, vocab, d, rows_, 1.0f, dlogits_.data(), vocab,
               lnf_out_.data(), d, 0.0f, dhead, d);
  std::fill(d_resid_.begin(), d_resid_.end(), 0.0f);
  detail::layernorm_backward(d_norm_.data(), resid_[config_.layers].data(), lnf_mean_.data(),
                             lnf_rstd_.data(), params[kLnfWeight].data(), d_resid_.data(),
                             grads[kLnfWeight].data(), grads[kLnfBias].data(), rows_, d);
}

void GptModel::backward_block(std::size_t layer, UnitParams params, UnitGrads grads) {
  // On entry d_resid_ holds dL/d(block output); on exit dL/d(block input).
  const std::size_t d = config_.d_model;
  const std::size_t rows = rows_;
  BlockActivations& a = blocks_[layer];

  detail::linear_backward(d_resid_.data(), a.fc_act.data(), params[kMlpProjWeight].data(),
                          d_fc_.data(), grads[kMlpProjWeight].data(), grads[kMlpProjBias].data(),
                          rows, 4 * d, d, Accumulate::kNo);
  detail::gelu_backward(d_fc_.data(), a.fc_pre.data(), a.fc_tanh.data(), d_fc_.data(),
                        rows * 4 * d);
  detail::linear_backward(d_fc_.data(), a.ln2_out.data(), params[kFcWeight].data(), d_norm_.data(),
                          grads[kFcWeight].data(), grads[kFcBias].data(), rows, d, 4 * d,
                          Accumulate::kNo);
  // The residual path passes d_resid_ through; LayerNorm 2 adds its input gradient to it.
  detail::layernorm_backward(d_norm_.data(), a.resid_mid.data(), a.ln2_mean.data(),
                             a.ln2_rstd.data(), params[kLn2Weight].data(), d_resid_.data(),
                             grads[kLn2Weight].data(), grads[kLn2Bias].data(), rows, d);

  detail::linear_backward(d_resid_.data(), a.att_out.data(), params[kAttnProjWeight].data(),
                          d_att_.data(), grads[kAttnProjWeight].data(), grads[kAttnProjBias].data(),
                          rows, d, d, Accumulate::kNo);
  const detail::AttentionShape shape{sequences_, config_.seq_len, config_.heads, d};
  detail::attention_backward(shape, d_att_.data(), a.qkv.data(), a.prob.data(), d_qkv_.data(),
                             attention_scratch_.data());
  detail::linear_backward(d_qkv_.data(), a.ln1_out.data(), params[kAttnWeight].data(),
                          d_norm_.data(), grads[kAttnWeight].data(), grads[kAttnBias].data(), rows,
                          d, 3 * d, Accumulate::kNo);
  detail::layernorm_backward(d_norm_.data(), resid_[layer].data(), a.ln1_mean.data(),
                             a.ln1_rstd.data(), params[kLn1Weight].data(), d_resid_.data(),
                             grads[kLn1Weight].data(), grads[kLn1Bias].data(), rows, d);
}

void GptModel::backward_embedding(UnitGrads grads) {
  const std::size_t d = config_.d_model;
  std::span<float> dwte = grads[kTokenEmbedding];
  std::span<float> dwpe = grads[kPositionEmbedding];
  if (config_.tied_head) {
    std::copy(tied_wte_grad_.begin(), tied_wte_grad_.end(), dwte.begin());
  } else {
    std::fill(dwte.begin(), dwte.end(), 0.0f);
  }
  std::fill(dwpe.begin(), dwpe.end(), 0.0f);
  // Rows in order: a token that appears twice sums its gradients in one fixed order.
  for (std::size_t row = 0; row < rows_; ++row) {
    const float* g = d_resid_.data() + row * d;
    float* token_row = dwte.data() + static_cast<std::size_t>(inputs_[row]) * d;
    float* position_row = dwpe.data() + (row % config_.seq_len) * d;
    for (std::size_t i = 0; i < d; ++i) {
      token_row[i] += g[i];
      position_row[i] += g[i];
    }
  }
}

}  // namespace strata::gpt

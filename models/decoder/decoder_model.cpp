// DecoderModel: batches, the order of unit calls, embeddings, head and loss. The layers'
// arithmetic is in decoder_layer.cpp, incremental decoding in decoder_decode.cpp.
#include "models/decoder/decoder_model.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <thread>

#include "base/assert.hpp"
#include "models/gpt/kernels.hpp"
#include "models/decoder/attention.hpp"
#include "models/decoder/decoder_impl.hpp"
#include "models/decoder/linear.hpp"
#include "tiers/device/device.hpp"

namespace strata::llm {

using gpt::detail::gemm;
using gpt::detail::Transpose;

void set_blas_threads(std::uint32_t threads) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  openblas_set_num_threads(static_cast<int>(threads));
}

DecoderModel::Impl::Impl(const HfConfig& config_in, const DecoderOptions& options_in,
                         tiers::Device* device)
    : config(config_in),
      options(options_in),
      units(decoder_units(config_in)),
      dims(config_in),
      layer_layout(detail::layer_layout(units[1])),
      head_layout(detail::head_layout(units.back())) {
  if (options.seq_len == 0 || options.micro_batch == 0) {
    throw std::invalid_argument("DecoderModel: seq_len and micro_batch must be positive");
  }
  if (options.seq_len > config.max_position_embeddings) {
    throw HfConfigError(config.source.string() + ": key \"max_position_embeddings\": seq_len " +
                        std::to_string(options.seq_len) + " exceeds it (" +
                        std::to_string(config.max_position_embeddings) + ")");
  }
  const std::size_t max_rows = std::size_t{options.micro_batch} * options.seq_len;
  inputs.resize(max_rows);
  targets.resize(max_rows);
  weights.resize(max_rows);
  row_position.resize(max_rows);
  row_first_key.resize(max_rows);
  const bool on_cuda = device != nullptr && device->kind() == tiers::DeviceKind::kCuda;
  for (const UnitSpec& spec : units) {
    fp32_read.push_back(on_cuda && !options.cuda_fp32_products
                            ? cuda_bf16_fp32_views_read(spec)
                            : std::vector<bool>(spec.tensors.size(), true));
  }
  if (on_cuda) {
#if STRATA_HAVE_CUDA
    cuda = detail::make_cuda_decoder(config, options, *device);
    return;
#else
    throw std::invalid_argument("DecoderModel: this build has no CUDA, so it cannot run on " +
                                device->name());
#endif
  }
  allocate_host_buffers();
}

void DecoderModel::Impl::allocate_host_buffers() {
  const std::size_t max_rows = std::size_t{options.micro_batch} * options.seq_len;
  const std::size_t d = dims.hidden;
  if (!dims.gpt2) rope = detail::RopeTable(config, options.seq_len);
  const detail::AttentionShape shape{options.micro_batch, options.seq_len, options.seq_len,
                                     dims.heads,          dims.kv_heads,   dims.head_dim,
                                     dims.window};
  resid.assign(config.num_layers + 1, std::vector<float>(max_rows * d, 0.0f));
  layers.resize(options.activation_checkpointing ? 1 : config.num_layers);
  for (detail::LayerBuffers& layer : layers) {
    layer.allocate(dims, max_rows, detail::attention_prob_floats(shape));
  }
  head_norm.assign(max_rows * d, 0.0f);
  head_mean.assign(max_rows, 0.0f);
  head_rstd.assign(max_rows, 0.0f);
  logits.assign(max_rows * dims.vocab, 0.0f);
  dlogits.assign(max_rows * dims.vocab, 0.0f);
  row_loss.assign(max_rows, 0.0);
  d_resid.assign(max_rows * d, 0.0f);
  d_norm.assign(max_rows * d, 0.0f);
  d_att.assign(max_rows * dims.q_width, 0.0f);
  d_qkv.assign(max_rows * dims.qkv_width, 0.0f);
  d_pre.assign(max_rows * dims.pre_width, 0.0f);
  d_act.assign(max_rows * dims.inner, 0.0f);
  attention_scratch.assign(detail::attention_scratch_floats(shape), 0.0f);
  if (config.tie_word_embeddings) tied_embedding_grad.assign(dims.vocab * d, 0.0f);
}

void DecoderModel::Impl::mark_documents(std::size_t batch_sequences, std::size_t positions_each) {
  const std::optional<std::int32_t> separator = options.document_separator;
  for (std::size_t b = 0; b < batch_sequences; ++b) {
    std::uint32_t start = 0;
    for (std::size_t t = 0; t < positions_each; ++t) {
      const std::size_t row = b * positions_each + t;
      if (separator && t > 0 && inputs[row - 1] == *separator) start = static_cast<std::uint32_t>(t);
      row_first_key[row] = start;
      row_position[row] = static_cast<std::uint32_t>(t) - start;
    }
  }
}

const float* DecoderModel::Impl::head_matrix(UnitParams params, UnitParams shared) const {
  return config.tie_word_embeddings ? shared[detail::kTokenEmbedding].data()
                                    : params[head_layout.lm_head].data();
}

void DecoderModel::Impl::check_bf16_views(const UnitSpec& spec, UnitParamsBf16 bf16) const {
  if (bf16.empty()) return;
  STRATA_ASSERT(bf16.size() == spec.tensors.size(), "one bf16 span per tensor, or none");
  for (std::size_t i = 0; i < bf16.size(); ++i) {
    STRATA_ASSERT(bf16[i].size() == spec.tensors[i].numel(), "bf16 parameter span of the wrong size");
  }
}

// A tensor's fp32 view may be empty where its bf16 view is given and the CUDA bf16 path does not
// read the fp32 one (fp32_views_read).
void DecoderModel::Impl::check_views(std::size_t unit, UnitParams params, UnitParams shared,
                                     const UnitBf16& bf16) const {
  STRATA_ASSERT(unit < units.size());
  const UnitSpec& spec = units[unit];
  check_bf16_views(spec, bf16.params);
  STRATA_ASSERT(params.size() == spec.tensors.size(), "one span per tensor of the unit");
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (params[i].empty() && !bf16.params.empty()) {
      STRATA_ASSERT(!fp32_read[unit][i], "an fp32 view this path reads left out");
      continue;
    }
    STRATA_ASSERT(params[i].size() == spec.tensors[i].numel(), "parameter span of the wrong size");
  }
  if (spec.reads_embedding) {
    STRATA_ASSERT(shared.size() == units[0].tensors.size(), "tied head needs the embedding unit");
    check_bf16_views(units[0], bf16.shared);
    const bool left_out = shared[detail::kTokenEmbedding].empty() && !bf16.shared.empty();
    STRATA_ASSERT(left_out ? !fp32_read[0][detail::kTokenEmbedding]
                           : shared[detail::kTokenEmbedding].size() == units[0].tensors[0].numel(),
                  "the tied head's embedding view");
  } else {
    STRATA_ASSERT(shared.empty() && bf16.shared.empty(), "only the tied head reads another unit");
  }
}

// [Note: bf16 decoder]: given bf16 views, the CUDA bf16 path reads as fp32 only the norms' gains
// and biases and the biases of its fp32 outputs (GPT-2's attention and MLP projections); the
// products' weights, the embeddings (their rows widen to the fp32 residual stream) and the head
// it reads in bf16.
std::vector<bool> cuda_bf16_fp32_views_read(const UnitSpec& spec) {
  std::vector<bool> read(spec.tensors.size(), false);
  const auto mark = [&read](std::size_t tensor) {
    if (tensor != detail::kAbsent) read.at(tensor) = true;
  };
  switch (spec.kind) {
    case UnitKind::kEmbedding:
      break;
    case UnitKind::kLayer: {
      const detail::LayerLayout l = detail::layer_layout(spec);
      for (std::size_t t : {l.norm1_weight, l.norm1_bias, l.norm2_weight, l.norm2_bias, l.out_bias,
                            l.proj_bias}) {
        mark(t);
      }
      break;
    }
    case UnitKind::kHead: {
      const detail::HeadLayout h = detail::head_layout(spec);
      mark(h.norm_weight);
      mark(h.norm_bias);
      break;
    }
  }
  return read;
}

std::vector<bool> DecoderModel::fp32_views_read(std::size_t unit) const {
  return impl_->fp32_read.at(unit);
}

DecoderModel::DecoderModel(const HfConfig& config, const DecoderOptions& options,
                           tiers::Device* device)
    : impl_(std::make_unique<Impl>(config, options, device)) {}
DecoderModel::~DecoderModel() = default;
DecoderModel::DecoderModel(DecoderModel&&) noexcept = default;
DecoderModel& DecoderModel::operator=(DecoderModel&&) noexcept = default;

const HfConfig& DecoderModel::config() const { return impl_->config; }
const DecoderOptions& DecoderModel::options() const { return impl_->options; }
const std::vector<UnitSpec>& DecoderModel::units() const { return impl_->units; }
std::size_t DecoderModel::unit_count() const { return impl_->units.size(); }

std::size_t DecoderModel::parameter_count() const {
  std::size_t count = 0;
  for (const UnitSpec& unit : impl_->units) count += unit.numel;
  return count;
}

bool DecoderModel::on_cuda() const { return impl_->cuda != nullptr; }

tiers::ComputeFence* DecoderModel::enable_asynchronous_calls() {
  return impl_->cuda ? impl_->cuda->enable_asynchronous_calls() : nullptr;
}

std::string_view DecoderModel::attention_implementation() const {
  return impl_->cuda ? impl_->cuda->attention_implementation() : "fp32 on the host";
}

std::size_t DecoderModel::activation_bytes() const {
  const Impl& m = *impl_;
  if (m.cuda) return m.cuda->activation_bytes();
  std::size_t floats = 0;
  for (const std::vector<float>& stream : m.resid) floats += stream.size();
  for (const detail::LayerBuffers& layer : m.layers) floats += layer.floats();
  for (const std::vector<float>* v :
       {&m.head_norm, &m.head_mean, &m.head_rstd, &m.logits, &m.dlogits, &m.weights, &m.d_resid,
        &m.d_norm, &m.d_att, &m.d_qkv, &m.d_pre, &m.d_act, &m.attention_scratch,
        &m.tied_embedding_grad}) {
    floats += v->size();
  }
  return floats * sizeof(float) + m.row_loss.size() * sizeof(double) +
         (m.inputs.size() + m.targets.size()) * sizeof(std::int32_t);
}

void DecoderModel::set_batch(std::span<const std::int32_t> tokens, std::size_t sequence_tokens,
                             std::span<const float> loss_weights) {
  Impl& m = *impl_;
  const std::size_t n = sequence_tokens == 0 ? m.options.seq_len + 1 : sequence_tokens;
  if (n < 2 || n > m.options.seq_len + 1) {
    throw std::invalid_argument("DecoderModel::set_batch: sequence_tokens " + std::to_string(n) +
                                " outside [2, seq_len + 1 = " +
                                std::to_string(m.options.seq_len + 1) + "]");
  }
  const std::size_t sequences = tokens.size() / n;
  if (tokens.size() % n != 0 || sequences == 0 || sequences > m.options.micro_batch) {
    throw std::invalid_argument("DecoderModel::set_batch: " + std::to_string(tokens.size()) +
                                " tokens are not 1 .. micro_batch (" +
                                std::to_string(m.options.micro_batch) + ") sequences of " +
                                std::to_string(n));
  }
  const std::size_t predicted = sequences * (n - 1);
  if (!loss_weights.empty() && loss_weights.size() != predicted) {
    throw std::invalid_argument("DecoderModel::set_batch: " + std::to_string(loss_weights.size()) +
                                " loss weights for " + std::to_string(predicted) + " targets");
  }
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || static_cast<std::size_t>(tokens[i]) >= m.dims.vocab) {
      throw std::out_of_range("DecoderModel::set_batch: token " + std::to_string(tokens[i]) +
                              " at position " + std::to_string(i) + " is outside [0, " +
                              std::to_string(m.dims.vocab) + ")");
    }
  }
  for (std::size_t i = 0; i < loss_weights.size(); ++i) {
    if (!(loss_weights[i] >= 0.0f) || !std::isfinite(loss_weights[i])) {
      throw std::invalid_argument("DecoderModel::set_batch: loss weight " + std::to_string(i) +
                                  " is not a finite non-negative number");
    }
  }
  for (std::size_t b = 0; b < sequences; ++b) {
    for (std::size_t t = 0; t + 1 < n; ++t) {
      const std::size_t row = b * (n - 1) + t;
      m.inputs[row] = tokens[b * n + t];
      m.targets[row] = tokens[b * n + t + 1];
      m.weights[row] = loss_weights.empty() ? 1.0f : loss_weights[row];
    }
  }
  m.mark_documents(sequences, n - 1);
  m.sequences = sequences;
  m.positions = n - 1;
  m.rows = predicted;
  if (m.cuda) {
    m.cuda->set_batch(std::span(m.inputs).first(predicted), std::span(m.targets).first(predicted),
                      std::span(m.weights).first(predicted),
                      std::span(m.row_position).first(predicted),
                      std::span(m.row_first_key).first(predicted), sequences, n - 1);
  }
  m.phase = Impl::Phase::kForward;
  m.next_unit = 0;
}

void DecoderModel::forward_unit(std::size_t unit, UnitParams params, UnitParams shared,
                                UnitBf16 bf16) {
  Impl& m = *impl_;
  STRATA_ASSERT(m.phase == Impl::Phase::kForward && unit == m.next_unit, "forward units in order");
  m.check_views(unit, params, shared, bf16);
  const detail::Bf16OperandsScope rounding(m.options.host_bf16_operands);
  const UnitSpec& spec = m.units[unit];
  switch (spec.kind) {
    case UnitKind::kEmbedding:
      m.cuda ? m.cuda->forward_embedding(params, bf16.params) : m.forward_embedding(params);
      break;
    case UnitKind::kLayer:
      m.cuda ? m.cuda->forward_layer(spec.layer, params, bf16.params)
             : m.forward_layer(spec.layer, params);
      break;
    case UnitKind::kHead:
      m.cuda ? m.cuda->forward_head(params, shared, bf16) : m.forward_head(params, shared);
      break;
  }
  ++m.next_unit;
}

double DecoderModel::loss() {
  Impl& m = *impl_;
  STRATA_ASSERT(m.phase == Impl::Phase::kForward && m.next_unit == m.units.size(),
                "loss after the last unit's forward");
  m.totals = m.cuda ? m.cuda->loss()
                    : detail::weighted_cross_entropy(m.logits.data(), m.targets.data(),
                                                     m.weights.data(), m.dlogits.data(),
                                                     m.row_loss.data(), m.rows, m.dims.vocab);
  m.phase = Impl::Phase::kBackward;
  return m.totals.mean();
}

double DecoderModel::loss_sum() const { return impl_->totals.loss_sum; }
double DecoderModel::loss_weight() const { return impl_->totals.weight; }

void DecoderModel::backward_unit(std::size_t unit, UnitParams params, UnitGrads grads,
                                 UnitParams shared, UnitBf16 bf16) {
  Impl& m = *impl_;
  STRATA_ASSERT(m.phase == Impl::Phase::kBackward && unit + 1 == m.next_unit,
                "backward units in reverse order, after loss()");
  m.check_views(unit, params, shared, bf16);
  const UnitSpec& spec = m.units[unit];
  STRATA_ASSERT(grads.size() == spec.tensors.size(), "one gradient span per tensor of the unit");
  for (std::size_t i = 0; i < grads.size(); ++i) {
    STRATA_ASSERT(grads[i].size() == spec.tensors[i].numel(), "gradient span of the wrong size");
  }
  const detail::Bf16OperandsScope rounding(m.options.host_bf16_operands);
  switch (spec.kind) {
    case UnitKind::kEmbedding:
      m.cuda ? m.cuda->backward_embedding(grads) : m.backward_embedding(grads);
      break;
    case UnitKind::kLayer:
      if (m.cuda) {
        if (m.options.activation_checkpointing) {
          m.cuda->forward_layer(spec.layer, params, bf16.params);
        }
        m.cuda->backward_layer(spec.layer, params, grads, bf16.params);
        break;
      }
      if (m.options.activation_checkpointing) m.forward_layer(spec.layer, params);
      m.backward_layer(spec.layer, params, grads);
      break;
    case UnitKind::kHead:
      m.cuda ? m.cuda->backward_head(params, grads, shared, bf16)
             : m.backward_head(params, grads, shared);
      break;
  }
  --m.next_unit;
  if (m.next_unit == 0) m.phase = Impl::Phase::kIdle;
}

void DecoderModel::Impl::forward_embedding(UnitParams p) {
  const std::size_t d = dims.hidden;
  const float* wte = p[detail::kTokenEmbedding].data();
  float* x = resid[0].data();
  for (std::size_t row = 0; row < rows; ++row) {
    const float* token = wte + static_cast<std::size_t>(inputs[row]) * d;
    std::copy(token, token + d, x + row * d);
    if (dims.gpt2) {
      const float* position = p[detail::kPositionEmbedding].data() + row_position[row] * d;
      for (std::size_t i = 0; i < d; ++i) x[row * d + i] += position[i];
    }
  }
}

void DecoderModel::Impl::forward_head(UnitParams p, UnitParams shared) {
  const detail::HeadLayout& h = head_layout;
  const std::size_t d = dims.hidden;
  norm_forward(p[h.norm_weight].data(), detail::tensor(p, h.norm_bias), resid.back().data(),
               head_norm.data(), head_mean.data(), head_rstd.data(), rows);
  // logits = norm·Eᵀ, E [vocab × d].
  detail::product(Transpose::kNo, Transpose::kYes, rows, dims.vocab, d, 1.0f, head_norm.data(), d,
       head_matrix(p, shared), d, 0.0f, logits.data(), dims.vocab);
}

void DecoderModel::Impl::backward_head(UnitParams p, UnitGrads g, UnitParams shared) {
  const detail::HeadLayout& h = head_layout;
  const std::size_t d = dims.hidden;
  const std::size_t vocab = dims.vocab;
  // A tied head's share of the embedding gradient waits for the embedding unit's backward.
  float* dhead = config.tie_word_embeddings ? tied_embedding_grad.data() : g[h.lm_head].data();
  detail::product(Transpose::kNo, Transpose::kNo, rows, d, vocab, 1.0f, dlogits.data(), vocab,
                  head_matrix(p, shared), d, 0.0f, d_norm.data(), d);
  detail::product(Transpose::kYes, Transpose::kNo, vocab, d, rows, 1.0f, dlogits.data(), vocab,
                  head_norm.data(), d, 0.0f, dhead, d);
  std::fill(d_resid.begin(), d_resid.end(), 0.0f);
  norm_backward(p[h.norm_weight].data(), d_norm.data(), resid.back().data(), head_mean.data(),
                head_rstd.data(), d_resid.data(), g[h.norm_weight].data(),
                detail::tensor(g, h.norm_bias), rows);
}

void DecoderModel::Impl::backward_embedding(UnitGrads g) {
  const std::size_t d = dims.hidden;
  std::span<float> dwte = g[detail::kTokenEmbedding];
  if (config.tie_word_embeddings) {
    std::copy(tied_embedding_grad.begin(), tied_embedding_grad.end(), dwte.begin());
  } else {
    std::fill(dwte.begin(), dwte.end(), 0.0f);
  }
  float* dwpe = nullptr;
  if (dims.gpt2) {
    std::span<float> position_grad = g[detail::kPositionEmbedding];
    std::fill(position_grad.begin(), position_grad.end(), 0.0f);
    dwpe = position_grad.data();
  }
  // Rows in order: a token that appears twice sums its gradients in one fixed order.
  for (std::size_t row = 0; row < rows; ++row) {
    const float* grad = d_resid.data() + row * d;
    float* token = dwte.data() + static_cast<std::size_t>(inputs[row]) * d;
    for (std::size_t i = 0; i < d; ++i) token[i] += grad[i];
    if (dwpe != nullptr) {
      float* position = dwpe + row_position[row] * d;
      for (std::size_t i = 0; i < d; ++i) position[i] += grad[i];
    }
  }
}

std::span<const float> DecoderModel::logits() const {
  Impl& m = *impl_;
  if (m.cuda) {
    m.cuda->copy_logits(m.cuda_logits);
    return m.cuda_logits;
  }
  return std::span<const float>(m.logits).first(m.rows * m.dims.vocab);
}

}  // namespace strata::llm

// CudaDecoderBase (decoder_cuda_base.hpp): the batch, the residual stream's buffers, the
// embedding and the attention choice, shared by the fp32 reference and the bf16 paths.
#include "models/decoder/decoder_cuda_base.hpp"

#include <stdexcept>
#include <string>

#include "base/assert.hpp"
#include "models/decoder/flash_attention.hpp"

namespace strata::llm::detail {

template <typename Id>
void CudaDecoderBase::HostRowIndex::build(std::span<const Id> ids, std::size_t id_count) {
  offsets.assign(id_count + 1, 0);
  for (const Id id : ids) ++offsets[static_cast<std::size_t>(id) + 1];
  for (std::size_t v = 0; v < id_count; ++v) offsets[v + 1] += offsets[v];
  rows.resize(ids.size());
  next.assign(offsets.begin(), offsets.end() - 1);
  for (std::size_t row = 0; row < ids.size(); ++row) {
    rows[static_cast<std::size_t>(next[static_cast<std::size_t>(ids[row])]++)] =
        static_cast<std::int32_t>(row);
  }
}

CudaDecoderBase::CudaDecoderBase(const HfConfig& config, const DecoderOptions& options,
                                 tiers::Device& device)
    : CudaBackend(device, "decoder"),
      config_(config),
      options_(options),
      units_(decoder_units(config)),
      dims_(config),
      layout_(layer_layout(units_[1])),
      head_(head_layout(units_.back())),
      max_rows_(std::size_t{options.micro_batch} * options.seq_len) {
  STRATA_ASSERT(device.kind() == tiers::DeviceKind::kCuda);
  if (dims_.head_dim > cuda::kMaxAttentionHeadDim) {
    throw std::invalid_argument(
        config.source.string() + ": head_dim " + std::to_string(dims_.head_dim) +
        " exceeds the CUDA attention kernels' " + std::to_string(cuda::kMaxAttentionHeadDim));
  }
  // Counted by decoder_cuda_plan.cpp's cuda_decoder_base_bytes, in this order.
  const std::size_t rows = max_rows_;
  const std::size_t d = dims_.hidden;
  inputs_ = allocate<std::int32_t>(rows);
  targets_ = allocate<std::int32_t>(rows);
  weights_ = allocate<float>(rows);
  row_positions_ = allocate<std::uint32_t>(rows);
  row_first_keys_ = allocate<std::uint32_t>(rows);
  token_offsets_ = allocate<std::int32_t>(dims_.vocab + 1);
  token_rows_ = allocate<std::int32_t>(rows);
  if (dims_.gpt2) {
    position_table_rows_ = config_.max_position_embeddings;  // GPT-2's n_positions: wpe's rows
    position_offsets_ = allocate<std::int32_t>(position_table_rows_ + 1);
    position_rows_ = allocate<std::int32_t>(rows);
  }
  row_loss_ = allocate<double>(rows);
  for (std::size_t l = 0; l <= config_.num_layers; ++l) resid_.push_back(allocate<float>(rows * d));
  d_resid_ = allocate<float>(rows * d);
  if (config_.tie_word_embeddings) tied_grad_ = allocate<float>(dims_.vocab * d);
  if (!dims_.gpt2) {
    const RopeTable table(config_, options_.seq_len);
    rope_half_ = config_.head_dim / 2;
    rope_cos_ = allocate<float>(table.cos().size());
    rope_sin_ = allocate<float>(table.sin().size());
    copy_in(rope_cos_, table.cos().data(), table.cos().size());
    copy_in(rope_sin_, table.sin().data(), table.sin().size());
    finish();
  }
  STRATA_ASSERT(allocated_bytes() == cuda_decoder_base_bytes(config_, options_).allocated,
                "decoder_cuda_plan.cpp counts other base buffers than these");
}

void CudaDecoderBase::set_batch(std::span<const std::int32_t> inputs,
                                std::span<const std::int32_t> targets,
                                std::span<const float> weights,
                                std::span<const std::uint32_t> row_positions,
                                std::span<const std::uint32_t> row_first_keys,
                                std::size_t sequences, std::size_t positions) {
  set_device();
  sequences_ = sequences;
  positions_ = positions;
  rows_ = inputs.size();
  STRATA_ASSERT(rows_ <= max_rows_);
  // The embedding backward sums every token's (and GPT-2 position's) rows in row order, as the
  // host does.
  token_index_.build(inputs, dims_.vocab);
  if (dims_.gpt2) position_index_.build(row_positions, position_table_rows_);
  host_weights_.assign(weights.begin(), weights.end());
  copy_in(inputs_, inputs.data(), rows_);
  copy_in(targets_, targets.data(), rows_);
  copy_in(weights_, weights.data(), rows_);
  copy_in(row_positions_, row_positions.data(), rows_);
  copy_in(row_first_keys_, row_first_keys.data(), rows_);
  copy_in(token_offsets_, token_index_.offsets.data(), token_index_.offsets.size());
  copy_in(token_rows_, token_index_.rows.data(), rows_);
  if (dims_.gpt2) {
    copy_in(position_offsets_, position_index_.offsets.data(), position_index_.offsets.size());
    copy_in(position_rows_, position_index_.rows.data(), rows_);
  }
  finish();  // the host vectors may change with the next batch
}

void CudaDecoderBase::forward_embedding(UnitParams p, UnitParamsBf16 p16) {
  set_device();
  if (p[kTokenEmbedding].empty()) {  // read in bf16 (DecoderModel::fp32_views_read)
    STRATA_ASSERT(!p16.empty(), "an embedding with neither view");
    const auto* wte = reinterpret_cast<const __nv_bfloat16*>(p16[kTokenEmbedding].data());
    const auto* wpe = dims_.gpt2
                          ? reinterpret_cast<const __nv_bfloat16*>(p16[kPositionEmbedding].data())
                          : nullptr;
    check(cuda::embedding_forward_bf16(inputs_, wte, wpe, row_positions_, resid_[0], rows_,
                                       dims_.hidden, stream_),
          "embedding_forward_bf16");
  } else {
    const float* wpe = dims_.gpt2 ? p[kPositionEmbedding].data() : nullptr;
    check(cuda::embedding_forward(inputs_, p[kTokenEmbedding].data(), wpe, row_positions_,
                                  resid_[0], rows_, dims_.hidden, stream_),
          "embedding_forward");
  }
  end_call();
}

void CudaDecoderBase::backward_embedding(UnitGrads g) {
  set_device();
  const std::size_t d = dims_.hidden;
  check(cuda::embedding_backward(d_resid_, {token_offsets_, token_rows_, dims_.vocab},
                                 config_.tie_word_embeddings ? tied_grad_ : nullptr,
                                 g[kTokenEmbedding].data(), d, stream_),
        "embedding_backward");
  if (dims_.gpt2) {
    check(cuda::embedding_backward(d_resid_,
                                   {position_offsets_, position_rows_, position_table_rows_},
                                   nullptr, g[kPositionEmbedding].data(), d, stream_),
          "embedding_backward");
  }
  end_call();
}

bool CudaDecoderBase::use_flash_attention(bool wanted_by_default) const {
  const bool supported = cuda::flash_attention_supported(dims_.head_dim, device_index_);
  switch (options_.cuda_attention) {
    case CudaAttention::kAuto:
      return supported && wanted_by_default;
    case CudaAttention::kTensorCores:
      if (!supported) {
        throw std::invalid_argument(
            config_.source.string() + ": head_dim " + std::to_string(dims_.head_dim) +
            ": the tensor-core attention takes a multiple of 8 up to " +
            std::to_string(cuda::kMaxAttentionHeadDim) + " on an sm_80 or newer GPU");
      }
      return true;
    case CudaAttention::kFp32:
      return false;
  }
  return false;
}

float CudaDecoderBase::inverse_loss_weight(double* total_weight) const {
  double total = 0.0;
  for (const float w : host_weights_) total += w;  // rows in order, as on the host
  *total_weight = total;
  return total > 0.0 ? static_cast<float>(1.0 / total) : 0.0f;
}

}  // namespace strata::llm::detail

// Incremental decoding with a KV cache: each feed runs the layers over the new tokens only,
// appending their keys and values (after RoPE) to the cache and attending over all cached
// positions. The arithmetic is the training forward's (decoder_layer.cpp); only the attention's
// keys come from the cache.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "base/assert.hpp"
#include "models/gpt/kernels.hpp"
#include "models/decoder/attention.hpp"
#include "models/decoder/decoder_impl.hpp"

namespace strata::llm {
namespace {

// Prompt tokens attend in chunks of this many queries, bounding the score scratch to
// heads × kQueryChunk × max_positions floats however long the prompt.
constexpr std::size_t kQueryChunk = 64;

}  // namespace

void DecoderModel::start_decoding(std::size_t max_positions) {
  Impl& m = *impl_;
  if (m.cuda) {
    throw std::invalid_argument(
        "DecoderModel::start_decoding: decoding with the KV cache runs on the host; build the "
        "model without a CUDA device to generate");
  }
  if (max_positions == 0 || max_positions > m.config.max_position_embeddings) {
    throw std::invalid_argument("DecoderModel::start_decoding: max_positions " +
                                std::to_string(max_positions) + " outside [1, " +
                                std::to_string(m.config.max_position_embeddings) +
                                "] (max_position_embeddings of " + m.config.source.string() + ")");
  }
  Impl::Decoding& s = m.decoding;
  const detail::Dims& dims = m.dims;
  s.max_positions = max_positions;
  s.positions = 0;
  s.fed = 0;
  s.next_unit = 0;
  s.active = true;
  s.tokens.assign(max_positions, 0);
  s.k_cache.assign(m.config.num_layers, std::vector<float>(max_positions * dims.kv_width, 0.0f));
  s.v_cache.assign(m.config.num_layers, std::vector<float>(max_positions * dims.kv_width, 0.0f));
  const std::size_t chunk = std::min(kQueryChunk, max_positions);
  s.layer.allocate(dims, max_positions, dims.heads * chunk * max_positions);
  s.x.assign(max_positions * dims.hidden, 0.0f);
  s.head_norm.assign(dims.hidden, 0.0f);
  s.head_mean.assign(1, 0.0f);
  s.head_rstd.assign(1, 0.0f);
  s.logits.assign(dims.vocab, 0.0f);
  if (!dims.gpt2) s.rope = detail::RopeTable(m.config, max_positions);
}

void DecoderModel::feed(std::span<const std::int32_t> tokens) {
  Impl& m = *impl_;
  Impl::Decoding& s = m.decoding;
  STRATA_ASSERT(s.active && s.next_unit == 0, "feed after start_decoding, between whole passes");
  if (tokens.empty() || s.positions + tokens.size() > s.max_positions) {
    throw std::invalid_argument("DecoderModel::feed: " + std::to_string(tokens.size()) +
                                " tokens after " + std::to_string(s.positions) +
                                " exceed max_positions " + std::to_string(s.max_positions));
  }
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || static_cast<std::size_t>(tokens[i]) >= m.dims.vocab) {
      throw std::out_of_range("DecoderModel::feed: token " + std::to_string(tokens[i]) +
                              " at position " + std::to_string(i) + " is outside [0, " +
                              std::to_string(m.dims.vocab) + ")");
    }
  }
  std::copy(tokens.begin(), tokens.end(), s.tokens.begin());
  s.fed = tokens.size();
}

void DecoderModel::decode_unit(std::size_t unit, UnitParams params, UnitParams shared) {
  Impl& m = *impl_;
  Impl::Decoding& s = m.decoding;
  STRATA_ASSERT(s.active && s.fed > 0 && unit == s.next_unit, "decode units in order after feed");
  m.check_views(unit, params, shared);
  const UnitSpec& spec = m.units[unit];
  switch (spec.kind) {
    case UnitKind::kEmbedding:
      m.decode_embedding(params);
      break;
    case UnitKind::kLayer:
      m.decode_layer(spec.layer, params);
      break;
    case UnitKind::kHead:
      m.decode_head(params, shared);
      break;
  }
  ++s.next_unit;
  if (s.next_unit == m.units.size()) {
    s.positions += s.fed;
    s.fed = 0;
    s.next_unit = 0;
  }
}

std::span<const float> DecoderModel::next_logits() const {
  return impl_->decoding.logits;
}

std::size_t DecoderModel::decoded_positions() const {
  return impl_->decoding.positions;
}

void DecoderModel::Impl::decode_embedding(UnitParams p) {
  Decoding& s = decoding;
  const std::size_t d = dims.hidden;
  const float* wte = p[detail::kTokenEmbedding].data();
  for (std::size_t row = 0; row < s.fed; ++row) {
    const float* token = wte + static_cast<std::size_t>(s.tokens[row]) * d;
    float* x = s.x.data() + row * d;
    std::copy(token, token + d, x);
    if (dims.gpt2) {
      const float* position = p[detail::kPositionEmbedding].data() + (s.positions + row) * d;
      for (std::size_t i = 0; i < d; ++i) x[i] += position[i];
    }
  }
}

void DecoderModel::Impl::decode_layer(std::size_t layer, UnitParams p) {
  Decoding& s = decoding;
  detail::LayerBuffers& a = s.layer;
  const std::size_t n = s.fed;
  attention_inputs(p, s.x.data(), a, n, s.rope, s.max_positions, s.positions);
  // Append the new keys and values to the cache.
  const std::size_t kv = dims.kv_width;
  for (std::size_t row = 0; row < n; ++row) {
    const float* k = a.qkv.data() + row * dims.qkv_width + dims.q_width;
    std::copy(k, k + kv, s.k_cache[layer].data() + (s.positions + row) * kv);
    std::copy(k + kv, k + 2 * kv, s.v_cache[layer].data() + (s.positions + row) * kv);
  }
  for (std::size_t first = 0; first < n; first += kQueryChunk) {
    const std::size_t last = std::min(n, first + kQueryChunk);
    const detail::AttentionShape shape{1,          last - first,  s.positions + last,
                                       dims.heads, dims.kv_heads, dims.head_dim,
                                       dims.window};
    detail::attention_forward(shape, {a.qkv.data() + first * dims.qkv_width, dims.qkv_width},
                              {s.k_cache[layer].data(), kv}, {s.v_cache[layer].data(), kv},
                              a.prob.data(), {a.att.data() + first * dims.q_width, dims.q_width});
  }
  attention_output_and_mlp(p, s.x.data(), a, s.x.data(), n);
}

void DecoderModel::Impl::decode_head(UnitParams p, UnitParams shared) {
  Decoding& s = decoding;
  const std::size_t d = dims.hidden;
  const float* last = s.x.data() + (s.fed - 1) * d;
  norm_forward(p[head_layout.norm_weight].data(), detail::tensor(p, head_layout.norm_bias), last,
               s.head_norm.data(), s.head_mean.data(), s.head_rstd.data(), 1);
  gpt::detail::gemm(gpt::detail::Transpose::kNo, gpt::detail::Transpose::kYes, 1, dims.vocab, d,
                    1.0f, s.head_norm.data(), d, head_matrix(p, shared), d, 0.0f,
                    s.logits.data(), dims.vocab);
}

}  // namespace strata::llm

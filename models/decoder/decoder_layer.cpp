// One decoder layer's forward and backward on the host: pre-norm attention and MLP blocks with
// residuals, in the layout of each family (decoder_layout.hpp).
#include <algorithm>

#include "models/decoder/attention.hpp"
#include "models/decoder/decoder_impl.hpp"
#include "models/decoder/linear.hpp"
#include "models/decoder/mlp_kernels.hpp"
#include "models/decoder/norm_kernels.hpp"

namespace strata::llm {

using detail::Accumulate;
using detail::ConstStrided;
using detail::Layout;
using detail::tensor;

namespace {

void add_into(float* out, const float* x, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) out[i] += x[i];
}

}  // namespace

namespace detail {

Dims::Dims(const HfConfig& config)
    : hidden(config.hidden_size),
      heads(config.num_heads),
      kv_heads(config.num_kv_heads),
      head_dim(config.head_dim),
      q_width(std::size_t{config.num_heads} * config.head_dim),
      kv_width(std::size_t{config.num_kv_heads} * config.head_dim),
      inner(config.intermediate_size),
      vocab(config.vocab_size),
      window(config.sliding_window.value_or(0)),
      gpt2(config.is_gpt2()),
      eps(static_cast<float>(config.norm_eps)),
      activation(config.activation) {
  qkv_width = q_width + 2 * kv_width;
  pre_width = gpt2 ? inner : 2 * inner;
}

void LayerBuffers::allocate(const Dims& dims, std::size_t rows, std::size_t prob_floats) {
  norm1.assign(rows * dims.hidden, 0.0f);
  norm1_mean.assign(rows, 0.0f);
  norm1_rstd.assign(rows, 0.0f);
  qkv.assign(rows * dims.qkv_width, 0.0f);
  prob.assign(prob_floats, 0.0f);
  att.assign(rows * dims.q_width, 0.0f);
  mid.assign(rows * dims.hidden, 0.0f);
  norm2.assign(rows * dims.hidden, 0.0f);
  norm2_mean.assign(rows, 0.0f);
  norm2_rstd.assign(rows, 0.0f);
  pre.assign(rows * dims.pre_width, 0.0f);
  act.assign(rows * dims.inner, 0.0f);
}

std::size_t LayerBuffers::floats() const {
  std::size_t count = 0;
  for (const std::vector<float>* v : {&norm1, &norm1_mean, &norm1_rstd, &qkv, &prob, &att, &mid,
                                      &norm2, &norm2_mean, &norm2_rstd, &pre, &act}) {
    count += v->size();
  }
  return count;
}

}  // namespace detail

void DecoderModel::Impl::norm_forward(const float* weight, const float* bias, const float* x,
                                      float* y, float* mean, float* rstd, std::size_t n) const {
  const detail::NormShape shape{n, dims.hidden, dims.eps};
  if (dims.gpt2) {
    detail::layer_norm_forward(shape, x, weight, bias, y, mean, rstd);
  } else {
    detail::rms_norm_forward(shape, x, weight, y, rstd);
  }
}

void DecoderModel::Impl::norm_backward(const float* weight, const float* dy, const float* x,
                                       const float* mean, const float* rstd, float* dx,
                                       float* dweight, float* dbias, std::size_t n) const {
  const detail::NormShape shape{n, dims.hidden, dims.eps};
  if (dims.gpt2) {
    detail::layer_norm_backward(shape, dy, x, mean, rstd, weight, dx, dweight, dbias);
  } else {
    detail::rms_norm_backward(shape, dy, x, rstd, weight, dx, dweight);
  }
}

void DecoderModel::Impl::attention_inputs(UnitParams p, const float* x, detail::LayerBuffers& a,
                                          std::size_t n, const detail::RopeTable& table,
                                          std::size_t rows_per_sequence,
                                          std::size_t first_position,
                                          const std::uint32_t* row_positions) const {
  const detail::LayerLayout& l = layer_layout;
  const std::size_t d = dims.hidden;
  norm_forward(tensor(p, l.norm1_weight), tensor(p, l.norm1_bias), x, a.norm1.data(),
               a.norm1_mean.data(), a.norm1_rstd.data(), n);
  const ConstStrided in{a.norm1.data(), d};
  float* qkv = a.qkv.data();
  const std::size_t ld = dims.qkv_width;
  if (dims.gpt2) {
    detail::linear_forward(Layout::kInOut, in, tensor(p, l.qkv_weight), tensor(p, l.qkv_bias),
                           {qkv, ld}, n, d, 3 * d);
    return;
  }
  detail::linear_forward(Layout::kOutIn, in, tensor(p, l.q_weight), tensor(p, l.q_bias),
                         {qkv, ld}, n, d, dims.q_width);
  detail::linear_forward(Layout::kOutIn, in, tensor(p, l.k_weight), tensor(p, l.k_bias),
                         {qkv + dims.q_width, ld}, n, d, dims.kv_width);
  detail::linear_forward(Layout::kOutIn, in, tensor(p, l.v_weight), tensor(p, l.v_bias),
                         {qkv + dims.q_width + dims.kv_width, ld}, n, d, dims.kv_width);
  using Direction = detail::RopeTable::Direction;
  table.rotate(qkv, ld, n, dims.heads, rows_per_sequence, first_position, Direction::kForward,
               row_positions);
  table.rotate(qkv + dims.q_width, ld, n, dims.kv_heads, rows_per_sequence, first_position,
               Direction::kForward, row_positions);
}

void DecoderModel::Impl::attention_output_and_mlp(UnitParams p, const float* x,
                                                  detail::LayerBuffers& a, float* out,
                                                  std::size_t n) const {
  const detail::LayerLayout& l = layer_layout;
  const std::size_t d = dims.hidden;
  const std::size_t inner = dims.inner;
  const ConstStrided att{a.att.data(), dims.q_width};
  float* mid = a.mid.data();
  if (dims.gpt2) {
    detail::linear_forward(Layout::kInOut, att, tensor(p, l.out_weight), tensor(p, l.out_bias),
                           {mid, d}, n, d, d);
  } else {
    detail::linear_forward(Layout::kOutIn, att, tensor(p, l.o_weight), nullptr, {mid, d}, n,
                           dims.q_width, d);
  }
  add_into(mid, x, n * d);  // the last read of x: out may alias it
  norm_forward(tensor(p, l.norm2_weight), tensor(p, l.norm2_bias), mid, a.norm2.data(),
               a.norm2_mean.data(), a.norm2_rstd.data(), n);
  const ConstStrided in{a.norm2.data(), d};
  const ConstStrided hidden{a.act.data(), inner};
  if (dims.gpt2) {
    detail::linear_forward(Layout::kInOut, in, tensor(p, l.fc_weight), tensor(p, l.fc_bias),
                           {a.pre.data(), inner}, n, d, inner);
    detail::plain_forward(dims.activation, a.pre.data(), a.act.data(), n * inner);
    detail::linear_forward(Layout::kInOut, hidden, tensor(p, l.proj_weight),
                           tensor(p, l.proj_bias), {out, d}, n, inner, d);
  } else {
    const std::size_t ld = dims.pre_width;
    detail::linear_forward(Layout::kOutIn, in, tensor(p, l.gate_weight), nullptr,
                           {a.pre.data(), ld}, n, d, inner);
    detail::linear_forward(Layout::kOutIn, in, tensor(p, l.up_weight), nullptr,
                           {a.pre.data() + inner, ld}, n, d, inner);
    detail::gated_forward(dims.activation, a.pre.data(), a.act.data(), n, inner);
    detail::linear_forward(Layout::kOutIn, hidden, tensor(p, l.down_weight), nullptr, {out, d}, n,
                           inner, d);
  }
  add_into(out, mid, n * d);
}

void DecoderModel::Impl::forward_layer(std::size_t layer, UnitParams p) {
  detail::LayerBuffers& a = layer_buffers(layer);
  const float* x = resid[layer].data();
  attention_inputs(p, x, a, rows, rope, positions, 0, row_position.data());
  const detail::AttentionShape shape{sequences,     positions,     positions,
                                     dims.heads,    dims.kv_heads, dims.head_dim,
                                     dims.window,   row_first_key.data()};
  const float* qkv = a.qkv.data();
  const std::size_t ld = dims.qkv_width;
  detail::attention_forward(shape, {qkv, ld}, {qkv + dims.q_width, ld},
                            {qkv + dims.q_width + dims.kv_width, ld}, a.prob.data(),
                            {a.att.data(), dims.q_width});
  attention_output_and_mlp(p, x, a, resid[layer + 1].data(), rows);
}

// On entry d_resid holds dL/d(layer output); on exit dL/d(layer input).
void DecoderModel::Impl::backward_layer(std::size_t layer, UnitParams p, UnitGrads g) {
  detail::LayerBuffers& a = layer_buffers(layer);
  backward_mlp(p, g, a);
  backward_attention(p, g, a);
  backward_attention_inputs(p, g, a, resid[layer].data());
}

void DecoderModel::Impl::backward_mlp(UnitParams p, UnitGrads g, const detail::LayerBuffers& a) {
  const detail::LayerLayout& l = layer_layout;
  const std::size_t d = dims.hidden;
  const std::size_t inner = dims.inner;
  const std::size_t n = rows;
  const ConstStrided dout{d_resid.data(), d};
  const ConstStrided norm2{a.norm2.data(), d};

  // MLP: d_norm = dL/d(norm2 output).
  if (dims.gpt2) {
    detail::linear_backward(Layout::kInOut, dout, {a.act.data(), inner}, tensor(p, l.proj_weight),
                            {d_act.data(), inner}, tensor(g, l.proj_weight), tensor(g, l.proj_bias),
                            n, inner, d, Accumulate::kNo);
    detail::plain_backward(dims.activation, d_act.data(), a.pre.data(), d_pre.data(), n * inner);
    detail::linear_backward(Layout::kInOut, {d_pre.data(), inner}, norm2, tensor(p, l.fc_weight),
                            {d_norm.data(), d}, tensor(g, l.fc_weight), tensor(g, l.fc_bias), n, d,
                            inner, Accumulate::kNo);
  } else {
    const std::size_t ld = dims.pre_width;
    detail::linear_backward(Layout::kOutIn, dout, {a.act.data(), inner}, tensor(p, l.down_weight),
                            {d_act.data(), inner}, tensor(g, l.down_weight), nullptr, n, inner, d,
                            Accumulate::kNo);
    detail::gated_backward(dims.activation, d_act.data(), a.pre.data(), d_pre.data(), n, inner);
    detail::linear_backward(Layout::kOutIn, {d_pre.data(), ld}, norm2, tensor(p, l.gate_weight),
                            {d_norm.data(), d}, tensor(g, l.gate_weight), nullptr, n, d, inner,
                            Accumulate::kNo);
    detail::linear_backward(Layout::kOutIn, {d_pre.data() + inner, ld}, norm2,
                            tensor(p, l.up_weight), {d_norm.data(), d}, tensor(g, l.up_weight),
                            nullptr, n, d, inner, Accumulate::kYes);
  }
  // The residual passes d_resid through; norm2 adds its input gradient to it.
  norm_backward(tensor(p, l.norm2_weight), d_norm.data(), a.mid.data(), a.norm2_mean.data(),
                a.norm2_rstd.data(), d_resid.data(), tensor(g, l.norm2_weight),
                tensor(g, l.norm2_bias), n);
}

void DecoderModel::Impl::backward_attention(UnitParams p, UnitGrads g,
                                            const detail::LayerBuffers& a) {
  const detail::LayerLayout& l = layer_layout;
  const std::size_t d = dims.hidden;
  const std::size_t n = rows;
  const ConstStrided dout{d_resid.data(), d};

  // Attention output projection: d_att = dL/d(attention output).
  const ConstStrided att{a.att.data(), dims.q_width};
  if (dims.gpt2) {
    detail::linear_backward(Layout::kInOut, dout, att, tensor(p, l.out_weight), {d_att.data(), d},
                            tensor(g, l.out_weight), tensor(g, l.out_bias), n, d, d,
                            Accumulate::kNo);
  } else {
    detail::linear_backward(Layout::kOutIn, dout, att, tensor(p, l.o_weight),
                            {d_att.data(), dims.q_width}, tensor(g, l.o_weight), nullptr, n,
                            dims.q_width, d, Accumulate::kNo);
  }
  const detail::AttentionShape shape{sequences,   positions,           positions,
                                     dims.heads,  dims.kv_heads,       dims.head_dim,
                                     dims.window, row_first_key.data()};
  const std::size_t ld = dims.qkv_width;
  const float* qkv = a.qkv.data();
  float* dqkv = d_qkv.data();
  const std::size_t k_offset = dims.q_width;
  const std::size_t v_offset = dims.q_width + dims.kv_width;
  detail::attention_backward(shape, {d_att.data(), dims.q_width}, {qkv, ld}, {qkv + k_offset, ld},
                             {qkv + v_offset, ld}, a.prob.data(), {dqkv, ld}, {dqkv + k_offset, ld},
                             {dqkv + v_offset, ld}, attention_scratch.data());
}

void DecoderModel::Impl::backward_attention_inputs(UnitParams p, UnitGrads g,
                                                   const detail::LayerBuffers& a, const float* x) {
  const detail::LayerLayout& l = layer_layout;
  const std::size_t d = dims.hidden;
  const std::size_t n = rows;
  const std::size_t ld = dims.qkv_width;
  float* dqkv = d_qkv.data();
  const std::size_t k_offset = dims.q_width;
  const std::size_t v_offset = dims.q_width + dims.kv_width;

  // Projections into q | k | v: d_norm = dL/d(norm1 output).
  const ConstStrided norm1{a.norm1.data(), d};
  if (dims.gpt2) {
    detail::linear_backward(Layout::kInOut, {dqkv, ld}, norm1, tensor(p, l.qkv_weight),
                            {d_norm.data(), d}, tensor(g, l.qkv_weight), tensor(g, l.qkv_bias), n,
                            d, 3 * d, Accumulate::kNo);
  } else {
    using Direction = detail::RopeTable::Direction;
    rope.rotate(dqkv, ld, n, dims.heads, positions, 0, Direction::kInverse, row_position.data());
    rope.rotate(dqkv + k_offset, ld, n, dims.kv_heads, positions, 0, Direction::kInverse,
                row_position.data());
    detail::linear_backward(Layout::kOutIn, {dqkv, ld}, norm1, tensor(p, l.q_weight),
                            {d_norm.data(), d}, tensor(g, l.q_weight), tensor(g, l.q_bias), n, d,
                            dims.q_width, Accumulate::kNo);
    detail::linear_backward(Layout::kOutIn, {dqkv + k_offset, ld}, norm1, tensor(p, l.k_weight),
                            {d_norm.data(), d}, tensor(g, l.k_weight), tensor(g, l.k_bias), n, d,
                            dims.kv_width, Accumulate::kYes);
    detail::linear_backward(Layout::kOutIn, {dqkv + v_offset, ld}, norm1, tensor(p, l.v_weight),
                            {d_norm.data(), d}, tensor(g, l.v_weight), tensor(g, l.v_bias), n, d,
                            dims.kv_width, Accumulate::kYes);
  }
  norm_backward(tensor(p, l.norm1_weight), d_norm.data(), x, a.norm1_mean.data(),
                a.norm1_rstd.data(), d_resid.data(), tensor(g, l.norm1_weight),
                tensor(g, l.norm1_bias), n);
}

}  // namespace strata::llm

// Causal self-attention on the host with grouped-query heads and an optional sliding window,
// computed per (sequence, head) with a [queries × keys] score matrix: softmax(scale·Q·Kᵀ + mask)·V.
//
// Each sequence has `queries` query rows and `keys` key/value rows; query i sits at position
// keys - queries + i (training: queries == keys; decoding: the new tokens after the cache).
// Query at position p attends to keys j with j <= p and, with a window W, p - j < W (itself
// included: W positions, transformers' sliding-window mask), and never before first_key[query]
// when the batch packs documents. Query head h reads key/value head
// h / (heads / kv_heads) (transformers' repeat_kv). Rows are strided (Strided views), so q, k
// and v may share one buffer. Probabilities are kept for backward ([sequences × heads ×
// queries × keys], zeros where masked).
// Small products run single-threaded in OpenBLAS, (sequence, head) pairs in parallel on oneTBB:
// every pair's arithmetic is the same for any thread count.
#pragma once

#include <cstddef>
#include <cstdint>

#include "models/decoder/linear.hpp"

namespace strata::llm::detail {

struct AttentionShape {
  std::size_t sequences;
  std::size_t queries;  // per sequence
  std::size_t keys;     // per sequence, >= queries
  std::size_t heads;
  std::size_t kv_heads;
  std::size_t head_dim;
  std::size_t window;  // 0: full causal attention
  // Packed documents (training only): per query row b·queries + i, the first key index of its
  // sequence it may see (its document's first position); null: 0 for every query.
  const std::uint32_t* first_key = nullptr;
};

// Per-sequence strides: sequence b's rows start at b·queries (q, out) or b·keys (k, v) rows.
void attention_forward(const AttentionShape& shape, ConstStrided q, ConstStrided k,
                       ConstStrided v, float* prob, Strided out);
// dq (overwritten), dk and dv (overwritten; the heads sharing a kv head summed in head order).
// scratch: attention_scratch_floats(shape).
void attention_backward(const AttentionShape& shape, ConstStrided dout, ConstStrided q,
                        ConstStrided k, ConstStrided v, const float* prob, Strided dq, Strided dk,
                        Strided dv, float* scratch);
std::size_t attention_prob_floats(const AttentionShape& shape);
std::size_t attention_scratch_floats(const AttentionShape& shape);

}  // namespace strata::llm::detail

// The GPT's CUDA kernels. Row-wise kernels give each row one warp, which calls gpt_math.hpp's row
// function with 32 lanes and WarpReduce; elementwise kernels are grid-stride loops over the same
// per-element functions the host uses; sums over rows (bias and LayerNorm parameter gradients)
// split each column's rows into 32 fixed strided subsets summed in order, then add the subsets in
// order; the embedding backward gives each output element one thread that walks its rows in
// order. Nothing here uses atomics, so every result is the same bits run to run.
#include "models/gpt/cuda_kernels.hpp"

#include <algorithm>

#include "models/gpt/gpt_math.hpp"

namespace strata::gpt::cuda {
namespace {

constexpr unsigned kThreadsPerBlock = 256;
constexpr unsigned kWarp = 32;
constexpr unsigned kRowsPerBlock = kThreadsPerBlock / kWarp;
constexpr std::size_t kMaxBlocks = 4096;  // grid-stride beyond
constexpr unsigned kColumnParts = 32;     // row subsets per column in the sums over rows
constexpr unsigned kColumnThreads = kColumnParts * kWarp;

unsigned elementwise_blocks(std::size_t count) {
  const std::size_t needed = (count + kThreadsPerBlock - 1) / kThreadsPerBlock;
  return static_cast<unsigned>(std::max<std::size_t>(1, std::min(needed, kMaxBlocks)));
}

unsigned one_per_thread_blocks(std::size_t count) {
  return static_cast<unsigned>((count + kThreadsPerBlock - 1) / kThreadsPerBlock);
}

unsigned column_blocks(std::size_t cols) {
  return static_cast<unsigned>((cols + kWarp - 1) / kWarp);
}

unsigned row_blocks(std::size_t rows) {
  return static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
}

// Butterfly over the 32 lanes of a warp: every lane ends with the same value, combined in a fixed
// pattern (deterministic).
struct WarpReduce {
  __host__ __device__ float sum(float value) const {
#if defined(__CUDA_ARCH__)
    for (unsigned offset = kWarp / 2; offset > 0; offset /= 2) {
      value += __shfl_xor_sync(0xffffffffu, value, offset);
    }
#endif
    return value;
  }
  __host__ __device__ float max(float value) const {
#if defined(__CUDA_ARCH__)
    for (unsigned offset = kWarp / 2; offset > 0; offset /= 2) {
      value = math::larger(value, __shfl_xor_sync(0xffffffffu, value, offset));
    }
#endif
    return value;
  }
};

__device__ std::size_t global_index() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ std::size_t grid_stride() {
  return static_cast<std::size_t>(gridDim.x) * blockDim.x;
}

// The row of this warp (rows per block × block + warp in block) and the lane within it.
__device__ std::size_t warp_row() {
  return static_cast<std::size_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
}

__device__ std::size_t warp_lane() {
  return threadIdx.x % kWarp;
}

__global__ void embedding_forward_kernel(const std::int32_t* inputs, const float* wte,
                                         const float* wpe, float* x, std::size_t rows,
                                         std::size_t seq, std::size_t d) {
  for (std::size_t e = global_index(); e < rows * d; e += grid_stride()) {
    const std::size_t row = e / d;
    const std::size_t i = e % d;
    x[e] = wte[static_cast<std::size_t>(inputs[row]) * d + i] + wpe[(row % seq) * d + i];
  }
}

__global__ void token_embedding_backward_kernel(const float* dx, const std::int32_t* token_offsets,
                                                const std::int32_t* token_rows,
                                                const float* tied_share, float* dwte,
                                                std::size_t vocab, std::size_t d) {
  const std::size_t e = global_index();
  if (e >= vocab * d) return;
  const std::size_t token = e / d;
  const std::size_t i = e % d;
  float sum = tied_share != nullptr ? tied_share[e] : 0.0f;
  for (std::int32_t k = token_offsets[token]; k < token_offsets[token + 1]; ++k) {
    sum += dx[static_cast<std::size_t>(token_rows[k]) * d + i];
  }
  dwte[e] = sum;
}

__global__ void position_embedding_backward_kernel(const float* dx, float* dwpe,
                                                   std::size_t sequences, std::size_t seq,
                                                   std::size_t d) {
  const std::size_t e = global_index();
  if (e >= seq * d) return;
  float sum = 0.0f;
  for (std::size_t s = 0; s < sequences; ++s) {
    sum += dx[s * seq * d + e];
  }
  dwpe[e] = sum;
}

__global__ void broadcast_rows_kernel(const float* bias, float* out, std::size_t rows,
                                      std::size_t cols) {
  for (std::size_t e = global_index(); e < rows * cols; e += grid_stride()) {
    out[e] = bias[e % cols];
  }
}

// Sums over rows: a block covers 32 adjacent columns (coalesced reads) with kColumnParts warps;
// warp p sums rows p, p + kColumnParts, ... in order, then one warp adds the parts in order.
__global__ void column_sums_kernel(const float* m, std::size_t rows, std::size_t cols, float* out) {
  __shared__ float partial[kColumnParts][kWarp + 1];
  const std::size_t c = static_cast<std::size_t>(blockIdx.x) * kWarp + warp_lane();
  const unsigned part = threadIdx.x / kWarp;
  float sum = 0.0f;
  if (c < cols) {
    for (std::size_t r = part; r < rows; r += kColumnParts) sum += m[r * cols + c];
  }
  partial[part][warp_lane()] = sum;
  __syncthreads();
  if (part == 0 && c < cols) {
    float total = 0.0f;
    for (unsigned p = 0; p < kColumnParts; ++p) total += partial[p][warp_lane()];
    out[c] = total;
  }
}

__global__ void add_in_place_kernel(float* out, const float* x, std::size_t count) {
  for (std::size_t e = global_index(); e < count; e += grid_stride()) {
    out[e] += x[e];
  }
}

__global__ void layernorm_forward_kernel(const float* x, const float* weight, const float* bias,
                                         float* out, float* mean, float* rstd, std::size_t rows,
                                         std::size_t dim) {
  const std::size_t row = warp_row();
  if (row >= rows) return;  // the whole warp leaves together
  math::layernorm_row_forward(x + row * dim, weight, bias, out + row * dim, mean + row, rstd + row,
                              dim, warp_lane(), kWarp, WarpReduce{});
}

__global__ void layernorm_backward_dx_kernel(const float* dout, const float* x, const float* mean,
                                             const float* rstd, const float* weight, float* dx,
                                             std::size_t rows, std::size_t dim) {
  const std::size_t row = warp_row();
  if (row >= rows) return;
  math::layernorm_row_backward(dout + row * dim, x + row * dim, mean[row], rstd[row], weight,
                               dx + row * dim, dim, warp_lane(), kWarp, WarpReduce{});
}

// LayerNorm's weight and bias gradients: sums over rows laid out as in column_sums_kernel.
__global__ void layernorm_parameter_grads_kernel(const float* dout, const float* x,
                                                 const float* mean, const float* rstd,
                                                 float* dweight, float* dbias, std::size_t rows,
                                                 std::size_t dim) {
  __shared__ float partial_weight[kColumnParts][kWarp + 1];
  __shared__ float partial_bias[kColumnParts][kWarp + 1];
  const std::size_t c = static_cast<std::size_t>(blockIdx.x) * kWarp + warp_lane();
  const unsigned part = threadIdx.x / kWarp;
  float sum_weight = 0.0f;
  float sum_bias = 0.0f;
  if (c < dim) {
    for (std::size_t r = part; r < rows; r += kColumnParts) {
      const float g = dout[r * dim + c];
      sum_weight += math::layernorm_weight_grad_term(g, x[r * dim + c], mean[r], rstd[r]);
      sum_bias += g;
    }
  }
  partial_weight[part][warp_lane()] = sum_weight;
  partial_bias[part][warp_lane()] = sum_bias;
  __syncthreads();
  if (part == 0 && c < dim) {
    float total_weight = 0.0f;
    float total_bias = 0.0f;
    for (unsigned p = 0; p < kColumnParts; ++p) {
      total_weight += partial_weight[p][warp_lane()];
      total_bias += partial_bias[p][warp_lane()];
    }
    dweight[c] = total_weight;
    dbias[c] = total_bias;
  }
}

__global__ void gelu_forward_kernel(const float* x, float* out, float* tanh_out,
                                    std::size_t count) {
  for (std::size_t e = global_index(); e < count; e += grid_stride()) {
    const float v = x[e];
    const float t = tanhf(math::gelu_tanh_argument(v));
    tanh_out[e] = t;
    out[e] = math::gelu_from_tanh(v, t);
  }
}

__global__ void gelu_backward_kernel(const float* dout, const float* x, const float* tanh_in,
                                     float* dx, std::size_t count) {
  for (std::size_t e = global_index(); e < count; e += grid_stride()) {
    dx[e] = dout[e] * math::gelu_derivative(x[e], tanh_in[e]);
  }
}

__global__ void causal_softmax_forward_kernel(float* scores, std::size_t rows, std::size_t seq) {
  const std::size_t row = warp_row();
  if (row >= rows) return;
  math::causal_softmax_row_forward(scores + row * seq, row % seq, seq, warp_lane(), kWarp,
                                   WarpReduce{});
}

__global__ void causal_softmax_backward_kernel(const float* prob, float* ds, std::size_t rows,
                                               std::size_t seq) {
  const std::size_t row = warp_row();
  if (row >= rows) return;
  math::causal_softmax_row_backward(prob + row * seq, ds + row * seq, row % seq, seq, warp_lane(),
                                    kWarp, WarpReduce{});
}

__global__ void cross_entropy_kernel(const float* logits, const std::int32_t* targets,
                                     float* dlogits, double* row_loss, std::size_t rows,
                                     std::size_t vocab, float inv_rows) {
  const std::size_t row = warp_row();
  if (row >= rows) return;
  const double loss = math::cross_entropy_row(
      logits + row * vocab, static_cast<std::size_t>(targets[row]), inv_rows, dlogits + row * vocab,
      vocab, warp_lane(), kWarp, WarpReduce{});
  if (warp_lane() == 0) row_loss[row] = loss;
}

}  // namespace

cudaError_t embedding_forward(const std::int32_t* inputs, const float* wte, const float* wpe,
                              float* x, std::size_t rows, std::size_t seq, std::size_t d,
                              cudaStream_t stream) {
  if (rows * d == 0) return cudaSuccess;
  embedding_forward_kernel<<<elementwise_blocks(rows * d), kThreadsPerBlock, 0, stream>>>(
      inputs, wte, wpe, x, rows, seq, d);
  return cudaGetLastError();
}

cudaError_t embedding_backward(const float* dx, const std::int32_t* token_offsets,
                               const std::int32_t* token_rows, const float* tied_share, float* dwte,
                               float* dwpe, std::size_t sequences, std::size_t seq,
                               std::size_t vocab, std::size_t d, cudaStream_t stream) {
  if (vocab * d != 0) {
    token_embedding_backward_kernel<<<one_per_thread_blocks(vocab * d), kThreadsPerBlock, 0,
                                      stream>>>(dx, token_offsets, token_rows, tied_share, dwte,
                                                vocab, d);
  }
  if (seq * d != 0) {
    position_embedding_backward_kernel<<<one_per_thread_blocks(seq * d), kThreadsPerBlock, 0,
                                         stream>>>(dx, dwpe, sequences, seq, d);
  }
  return cudaGetLastError();
}

cudaError_t broadcast_rows(const float* bias, float* out, std::size_t rows, std::size_t cols,
                           cudaStream_t stream) {
  if (rows * cols == 0) return cudaSuccess;
  broadcast_rows_kernel<<<elementwise_blocks(rows * cols), kThreadsPerBlock, 0, stream>>>(
      bias, out, rows, cols);
  return cudaGetLastError();
}

cudaError_t column_sums(const float* m, std::size_t rows, std::size_t cols, float* out,
                        cudaStream_t stream) {
  if (cols == 0) return cudaSuccess;
  column_sums_kernel<<<column_blocks(cols), kColumnThreads, 0, stream>>>(m, rows, cols, out);
  return cudaGetLastError();
}

cudaError_t add_in_place(float* out, const float* x, std::size_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  add_in_place_kernel<<<elementwise_blocks(count), kThreadsPerBlock, 0, stream>>>(out, x, count);
  return cudaGetLastError();
}

cudaError_t layernorm_forward(const float* x, const float* weight, const float* bias, float* out,
                              float* mean, float* rstd, std::size_t rows, std::size_t dim,
                              cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  layernorm_forward_kernel<<<row_blocks(rows), kThreadsPerBlock, 0, stream>>>(
      x, weight, bias, out, mean, rstd, rows, dim);
  return cudaGetLastError();
}

cudaError_t layernorm_backward(const float* dout, const float* x, const float* mean,
                               const float* rstd, const float* weight, float* dx, float* dweight,
                               float* dbias, std::size_t rows, std::size_t dim,
                               cudaStream_t stream) {
  if (rows != 0) {
    layernorm_backward_dx_kernel<<<row_blocks(rows), kThreadsPerBlock, 0, stream>>>(
        dout, x, mean, rstd, weight, dx, rows, dim);
  }
  if (dim != 0) {
    layernorm_parameter_grads_kernel<<<column_blocks(dim), kColumnThreads, 0, stream>>>(
        dout, x, mean, rstd, dweight, dbias, rows, dim);
  }
  return cudaGetLastError();
}

cudaError_t gelu_forward(const float* x, float* out, float* tanh_out, std::size_t count,
                         cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  gelu_forward_kernel<<<elementwise_blocks(count), kThreadsPerBlock, 0, stream>>>(x, out, tanh_out,
                                                                                  count);
  return cudaGetLastError();
}

cudaError_t gelu_backward(const float* dout, const float* x, const float* tanh_in, float* dx,
                          std::size_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  gelu_backward_kernel<<<elementwise_blocks(count), kThreadsPerBlock, 0, stream>>>(dout, x, tanh_in,
                                                                                   dx, count);
  return cudaGetLastError();
}

cudaError_t causal_softmax_forward(float* scores, std::size_t matrices, std::size_t seq,
                                   cudaStream_t stream) {
  const std::size_t rows = matrices * seq;
  if (rows == 0) return cudaSuccess;
  causal_softmax_forward_kernel<<<row_blocks(rows), kThreadsPerBlock, 0, stream>>>(scores, rows,
                                                                                   seq);
  return cudaGetLastError();
}

cudaError_t causal_softmax_backward(const float* prob, float* ds, std::size_t matrices,
                                    std::size_t seq, cudaStream_t stream) {
  const std::size_t rows = matrices * seq;
  if (rows == 0) return cudaSuccess;
  causal_softmax_backward_kernel<<<row_blocks(rows), kThreadsPerBlock, 0, stream>>>(prob, ds, rows,
                                                                                    seq);
  return cudaGetLastError();
}

cudaError_t cross_entropy(const float* logits, const std::int32_t* targets, float* dlogits,
                          double* row_loss, std::size_t rows, std::size_t vocab,
                          cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  cross_entropy_kernel<<<row_blocks(rows), kThreadsPerBlock, 0, stream>>>(
      logits, targets, dlogits, row_loss, rows, vocab, 1.0f / static_cast<float>(rows));
  return cudaGetLastError();
}

}  // namespace strata::gpt::cuda

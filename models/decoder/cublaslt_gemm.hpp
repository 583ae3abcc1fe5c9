// Row-major matrix products on cuBLASLt (cublaslt_gemm.cpp) for the decoder's bf16 CUDA path:
// bf16 operands, fp32 accumulation (CUBLAS_COMPUTE_32F, tensor cores), a bf16 or fp32 output,
// an optional addend C (the residual stream, or the output itself to accumulate) and an optional
// bias added to every row in the epilogue.
//
//   D[m × n] = op(A)[m × k] · op(B)[k × n]  (+ C[m × n])  (+ bias[n] on every row)
//
// Row-major on column-major cuBLASLt: a row-major matrix is its transpose in column-major, so
// Dᵀ = op(B)ᵀ · op(A)ᵀ runs with the operands swapped and m, n exchanged; the bias (one value
// per column of the row-major D) is then per row of the column-major one, which is what
// CUBLASLT_EPILOGUE_BIAS broadcasts.
//
// Where cuBLASLt has no algorithm with the bias epilogue for a shape (narrow, unaligned rows),
// the product runs without it and fused_kernels' add_row_bias adds the bias after.
// Algorithms: one per shape (sizes, strides, transposes, types, epilogue, the pointers'
// alignments), chosen from the heuristic's candidates once (Determinism, below) and kept; later
// products of that shape reuse it, so a shape always runs the same kernel.
// Determinism: cuBLAS documents every routine as bitwise reproducible run to run on GPUs of one
// architecture and SM count when one stream uses it and the workspace is the caller's own, as
// here. cuBLASLt has no atomics mode to switch off; its only cross-block reduction is split-K,
// and of the heuristic's candidates the first that does not split K, or reduces the split-K
// partial sums in fp32 in the workspace in a separate, fixed-order pass
// (CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE), is taken. See [Note: cuBLASLt determinism] in
// cublaslt_gemm.cpp.
// Threading: one LtGemm per stream and per host thread. Only CUDA-side sources include this.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>

namespace strata::llm::cuda {

enum class Transpose : std::uint8_t { kNo, kYes };
enum class ElementType : std::uint8_t { kBf16, kFp32 };

// A bf16 operand: row-major, row r at data + r·ld elements; op kYes uses its transpose.
struct GemmOperand {
  const void* data;
  std::size_t ld;
  Transpose op;
};

struct GemmProduct {
  std::size_t m = 0, n = 0, k = 0;
  GemmOperand a{}, b{};
  void* d = nullptr;  // row-major [m × n], stride ldd elements of d_type
  std::size_t ldd = 0;
  ElementType d_type = ElementType::kFp32;
  // Added to the product when not null: d_type elements with D's stride; may equal d (+=).
  const void* c = nullptr;
  // [n] elements of d_type added to every row when not null (CUBLASLT_EPILOGUE_BIAS).
  const void* bias = nullptr;
};

// The largest power of two up to 256 that divides the address: what the heuristic may assume of
// an operand, part of the key an algorithm is kept under (so two operands of one shape and one
// alignment run the same kernel, bit for bit).
unsigned operand_alignment(const void* pointer);

class LtGemm {
 public:
  // The workspace Hopper's cuBLAS recommends: the most this object uses.
  static constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;

  // `workspace`: workspace_bytes of device memory, 256-byte aligned, used by this object only;
  // the heuristic only offers algorithms that fit it.
  // `owner` names the model in errors. Throws tiers::CudaError when cuBLASLt cannot start.
  LtGemm(void* workspace, std::size_t workspace_bytes, int device_index, std::string owner);
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // Enqueues the product on `stream`. Throws tiers::CudaError when cuBLASLt refuses it or finds
  // no algorithm for it.
  void run(const GemmProduct& product, cudaStream_t stream);

  std::size_t cached_shapes() const { return plans_.size(); }

 private:
  struct Plan;  // descriptors and the chosen algorithm of one shape
  using Key =
      std::tuple<std::size_t, std::size_t, std::size_t, std::size_t, std::size_t, std::size_t, int,
                 int, int, bool, bool, unsigned, unsigned, unsigned, unsigned, unsigned>;
  Plan& plan_for(const GemmProduct& product);
  void describe(const GemmProduct& product, bool bias_epilogue, Plan& plan) const;
  bool choose_algorithm(const Key& key, Plan& plan) const;
  void add_bias_apart(const GemmProduct& product, cudaStream_t stream) const;
  void check(int status, const char* call) const;

  void* workspace_;
  std::size_t workspace_bytes_;
  int device_index_;
  std::string owner_;
  void* handle_ = nullptr;  // cublasLtHandle_t
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace strata::llm::cuda

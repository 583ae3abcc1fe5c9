// LtGemm (cublaslt_gemm.hpp): descriptors and one heuristic algorithm per product shape, kept
// for the object's life; each product sets its pointers and runs.
//
// [Note: cuBLASLt determinism]
// The same algorithm on the same inputs gives the same bits on one GPU: the tensor-core tiles sum
// in a fixed order, and cuBLAS documents its routines as reproducible run to run with one stream
// and a caller-owned workspace. The remaining risk is an algorithm whose blocks share a reduction:
// split-K. Of the heuristic's first kCandidates algorithms (best first) the first whose reduction
// scheme is NONE (no split-K) or COMPUTE_TYPE (fp32 partials in the workspace, reduced by a
// separate kernel in a fixed order) is taken; only if there is none is the heuristic's first
// taken (INPLACE, the remaining scheme, serialises its partial tiles on counters in the
// workspace, which the header's name for it says is also ordered; OUTPUT_TYPE reduces apart, as
// COMPUTE_TYPE, but in the output's precision). The choice is cached per shape, so a shape never
// changes kernels within a run, and the heuristic itself is a pure function of the shape and
// the device. Under activation checkpointing the recomputed forward asks for the same shapes
// with the same alignments (every activation buffer is allocated 256-byte aligned), hence the
// same kernels and the same bits.
#include "models/decoder/cublaslt_gemm.hpp"

#include <cublasLt.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "base/assert.hpp"
#include "models/decoder/fused_kernels.hpp"
#include "tiers/device/cuda_device.hpp"

namespace strata::llm::cuda {

unsigned operand_alignment(const void* pointer) {
  const auto address = reinterpret_cast<std::uintptr_t>(pointer);
  if (address == 0) return 256;
  return static_cast<unsigned>(std::min<std::uintptr_t>(256, address & (~address + 1)));
}
namespace {

cudaDataType_t to_cuda(ElementType type) {
  return type == ElementType::kBf16 ? CUDA_R_16BF : CUDA_R_32F;
}
cublasOperation_t to_cublas(Transpose op) {
  return op == Transpose::kYes ? CUBLAS_OP_T : CUBLAS_OP_N;
}


struct DescDeleter {
  void operator()(cublasLtMatmulDesc_t desc) const { cublasLtMatmulDescDestroy(desc); }
};
struct LayoutDeleter {
  void operator()(cublasLtMatrixLayout_t layout) const { cublasLtMatrixLayoutDestroy(layout); }
};
struct PreferenceDeleter {
  void operator()(cublasLtMatmulPreference_t pref) const { cublasLtMatmulPreferenceDestroy(pref); }
};
using Desc = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulDesc_t>, DescDeleter>;
using Layout = std::unique_ptr<std::remove_pointer_t<cublasLtMatrixLayout_t>, LayoutDeleter>;
using Preference =
    std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, PreferenceDeleter>;

}  // namespace

struct LtGemm::Plan {
  Desc desc;
  Layout a, b, d;  // cuBLASLt's A (our B), B (our A), and D (also C's layout)
  cublasLtMatmulAlgo_t algo{};
  // The bias epilogue had no algorithm for this shape: the product runs without it and
  // add_row_bias adds the bias after (one more rounding of a bf16 output).
  bool bias_apart = false;
};

LtGemm::LtGemm(void* workspace, std::size_t workspace_bytes, int device_index, std::string owner)
    : workspace_(workspace),
      workspace_bytes_(workspace_bytes),
      device_index_(device_index),
      owner_(std::move(owner)) {
  STRATA_ASSERT(workspace != nullptr && operand_alignment(workspace) == 256);
  cublasLtHandle_t handle = nullptr;
  check(cublasLtCreate(&handle), "cublasLtCreate");
  handle_ = handle;
}

LtGemm::~LtGemm() {
  plans_.clear();  // descriptors before the handle
  if (handle_ != nullptr) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

void LtGemm::check(int status, const char* call) const {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw tiers::CudaError(owner_ + ": " + call, device_index_, status,
                           cublasGetStatusString(static_cast<cublasStatus_t>(status)));
  }
}

LtGemm::Plan& LtGemm::plan_for(const GemmProduct& p) {
  const Key key{p.m,
                p.n,
                p.k,
                p.a.ld,
                p.b.ld,
                p.ldd,
                static_cast<int>(p.a.op),
                static_cast<int>(p.b.op),
                static_cast<int>(p.d_type),
                p.c != nullptr,
                p.bias != nullptr,
                operand_alignment(p.a.data),
                operand_alignment(p.b.data),
                operand_alignment(p.c != nullptr ? p.c : p.d),
                operand_alignment(p.d),
                operand_alignment(p.bias)};
  auto found = plans_.find(key);
  if (found != plans_.end()) return *found->second;
  auto plan = std::make_unique<Plan>();
  describe(p, p.bias != nullptr, *plan);
  bool chosen = choose_algorithm(key, *plan);
  if (!chosen && p.bias != nullptr) {  // the bias epilogue's kernels do not take this shape
    plan = std::make_unique<Plan>();
    describe(p, false, *plan);
    plan->bias_apart = true;
    chosen = choose_algorithm(key, *plan);
  }
  if (!chosen) {
    throw tiers::CudaError(owner_ + ": cublasLtMatmulAlgoGetHeuristic found no algorithm for " +
                               std::to_string(p.m) + "x" + std::to_string(p.n) + "x" +
                               std::to_string(p.k),
                           device_index_, CUBLAS_STATUS_NOT_SUPPORTED, "no algorithm");
  }
  return *plans_.emplace(key, std::move(plan)).first->second;
}

// The operation and matrix descriptors of a product (swapped operands: the header).
void LtGemm::describe(const GemmProduct& p, bool bias_epilogue, Plan& plan) const {
  cublasLtMatmulDesc_t desc = nullptr;
  check(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
        "cublasLtMatmulDescCreate");
  plan.desc.reset(desc);
  // cuBLASLt's A is our B, its B our A.
  const cublasOperation_t trans_a = to_cublas(p.b.op);
  const cublasOperation_t trans_b = to_cublas(p.a.op);
  check(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)),
      "cublasLtMatmulDescSetAttribute(TRANSA)");
  check(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)),
      "cublasLtMatmulDescSetAttribute(TRANSB)");
  if (bias_epilogue) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                         sizeof(epilogue)),
          "cublasLtMatmulDescSetAttribute(EPILOGUE)");
    const void* bias = p.bias;  // the heuristic reads its alignment; run() sets it each time
    check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                         sizeof(bias)),
          "cublasLtMatmulDescSetAttribute(BIAS_POINTER)");
  }

  // Row-major [rows × cols] with stride ld is column-major [cols × rows] with the same ld.
  auto layout = [&](Layout& out, cudaDataType_t type, std::size_t rows, std::size_t cols,
                    std::size_t ld) {
    cublasLtMatrixLayout_t created = nullptr;
    check(cublasLtMatrixLayoutCreate(&created, type, cols, rows, static_cast<std::int64_t>(ld)),
          "cublasLtMatrixLayoutCreate");
    out.reset(created);
  };
  const bool a_kept = p.a.op == Transpose::kNo;
  const bool b_kept = p.b.op == Transpose::kNo;
  layout(plan.a, CUDA_R_16BF, b_kept ? p.k : p.n, b_kept ? p.n : p.k, p.b.ld);
  layout(plan.b, CUDA_R_16BF, a_kept ? p.m : p.k, a_kept ? p.k : p.m, p.a.ld);
  layout(plan.d, to_cuda(p.d_type), p.m, p.n, p.ldd);
}

// The heuristic's candidates for the shape and the pointers' alignments (the key), and of them
// the one [Note: cuBLASLt determinism] takes; false when there is none.
bool LtGemm::choose_algorithm(const Key& key, Plan& plan) const {
  cublasLtMatmulPreference_t created = nullptr;
  check(cublasLtMatmulPreferenceCreate(&created), "cublasLtMatmulPreferenceCreate");
  const Preference preference(created);
  auto set_preference = [&](cublasLtMatmulPreferenceAttributes_t attribute, auto value) {
    check(cublasLtMatmulPreferenceSetAttribute(preference.get(), attribute, &value, sizeof(value)),
          "cublasLtMatmulPreferenceSetAttribute");
  };
  set_preference(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, std::uint64_t{workspace_bytes_});
  set_preference(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, std::get<12>(key));
  set_preference(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, std::get<11>(key));
  set_preference(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, std::get<13>(key));
  set_preference(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, std::get<14>(key));

  constexpr int kCandidates = 8;
  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  int candidates = 0;
  check(cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(handle_), plan.desc.get(),
                                       plan.a.get(), plan.b.get(), plan.d.get(), plan.d.get(),
                                       preference.get(), kCandidates, results, &candidates),
        "cublasLtMatmulAlgoGetHeuristic");
  if (candidates == 0) return false;
  plan.algo = results[0].algo;
  for (int i = 0; i < candidates; ++i) {
    std::uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_NONE;
    std::size_t written = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(&results[i].algo,
                                             CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme,
                                             sizeof(scheme), &written) != CUBLAS_STATUS_SUCCESS) {
      continue;
    }
    if (scheme == CUBLASLT_REDUCTION_SCHEME_NONE ||
        scheme == CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE) {
      plan.algo = results[i].algo;
      break;
    }
  }
  return true;
}

void LtGemm::run(const GemmProduct& p, cudaStream_t stream) {
  if (p.m == 0 || p.n == 0) return;
  STRATA_ASSERT(p.k > 0, "an empty sum: the caller fills D itself");
  STRATA_ASSERT(p.ldd >= p.n && p.a.ld >= (p.a.op == Transpose::kNo ? p.k : p.m) &&
                    p.b.ld >= (p.b.op == Transpose::kNo ? p.n : p.k),
                "a row stride shorter than its row");
  Plan& plan = plan_for(p);
  const bool bias_epilogue = p.bias != nullptr && !plan.bias_apart;
  if (bias_epilogue) {
    const void* bias = p.bias;
    check(cublasLtMatmulDescSetAttribute(plan.desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                         sizeof(bias)),
          "cublasLtMatmulDescSetAttribute(BIAS_POINTER)");
  }
  const float alpha = 1.0f;
  const float beta = p.c != nullptr ? 1.0f : 0.0f;
  const void* c = p.c != nullptr ? p.c : p.d;  // ignored at beta 0
  check(cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), plan.desc.get(), &alpha, p.b.data,
                       plan.a.get(), p.a.data, plan.b.get(), &beta, c, plan.d.get(), p.d,
                       plan.d.get(), &plan.algo, workspace_, workspace_bytes_, stream),
        "cublasLtMatmul");
  if (p.bias != nullptr && plan.bias_apart) add_bias_apart(p, stream);
}

void LtGemm::add_bias_apart(const GemmProduct& p, cudaStream_t stream) const {
  const cudaError_t result = p.d_type == ElementType::kBf16
                                 ? add_row_bias(static_cast<__nv_bfloat16*>(p.d), p.ldd, p.m, p.n,
                                                static_cast<const __nv_bfloat16*>(p.bias), stream)
                                 : add_row_bias(static_cast<float*>(p.d), p.ldd, p.m, p.n,
                                                static_cast<const float*>(p.bias), stream);
  if (result != cudaSuccess) {
    throw tiers::CudaError(owner_ + ": add_row_bias", device_index_, static_cast<int>(result),
                           cudaGetErrorString(result));
  }
}

}  // namespace strata::llm::cuda

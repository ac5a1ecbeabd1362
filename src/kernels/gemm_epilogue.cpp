// The cuBLASLt GEMM with the bias + GELU epilogue (gemm_epilogue.h). cuBLASLt is column-major: a
// row-major (R, C) buffer is read as its (C, R) transpose, so the product is written for those.
#include "src/kernels/gemm_epilogue.h"

#ifdef GPT2_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAStream.h>

#include <map>
#include <mutex>
#include <tuple>

#include "src/base/cuda_check.h"
#endif

namespace gpt2::kernels {

#ifdef GPT2_WITH_CUDA
namespace {

// One column-major product D (m, n) = op(A) op(B) + bias, GELU applied, its input kept in aux.
struct LtGemm {
  cublasOperation_t trans_a, trans_b;
  int64_t m, n, k;
  const void* a;
  int64_t lda;
  const void* b;
  int64_t ldb;
  void* d;
  int64_t ldd;
  cublasLtEpilogue_t epilogue;
  const void* bias;  // length m
  void* aux;         // the GELU input, (m, n) with leading dimension ldd
};

bool dtype_ok(const torch::Tensor& t, cudaDataType_t* type) {
  switch (t.scalar_type()) {
    case torch::kFloat: *type = CUDA_R_32F; return true;
    case torch::kBFloat16: *type = CUDA_R_16BF; return true;
    case torch::kHalf: *type = CUDA_R_16F; return true;
    default: return false;
  }
}

// RAII holders for the descriptors of one call.
struct Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descriptors() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// The heuristic's first choice per shape and epilogue, asked once (it costs tens of microseconds).
using AlgoKey = std::tuple<int, int, int64_t, int64_t, int64_t, int, int, int>;
struct AlgoCache {
  std::mutex mutex;
  std::map<AlgoKey, std::pair<bool, cublasLtMatmulAlgo_t>> algos;
};
AlgoCache& algo_cache() {
  static AlgoCache cache;
  return cache;
}

bool run(const LtGemm& g, cudaDataType_t type, int device) {
  const cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  Descriptors desc;
  CUBLASLT_CHECK(cublasLtMatmulDescCreate(&desc.op, compute, CUDA_R_32F));
  CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSA, &g.trans_a, sizeof(g.trans_a)));
  CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSB, &g.trans_b, sizeof(g.trans_b)));
  CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &g.epilogue, sizeof(g.epilogue)));
  CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias)));
  CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &type, sizeof(type)));
  CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux, sizeof(g.aux)));
  CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &g.ldd, sizeof(g.ldd)));
  const bool ta = g.trans_a == CUBLAS_OP_T, tb = g.trans_b == CUBLAS_OP_T;
  CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&desc.a, type, ta ? g.k : g.m, ta ? g.m : g.k, g.lda));
  CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&desc.b, type, tb ? g.n : g.k, tb ? g.k : g.n, g.ldb));
  CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&desc.d, type, g.m, g.n, g.ldd));

  const size_t workspace_size = at::cuda::getCUDABlasLtWorkspaceSize();
  void* workspace = at::cuda::getCUDABlasLtWorkspace();
  cublasLtHandle_t handle = at::cuda::getCurrentCUDABlasLtHandle();
  const AlgoKey key{device, static_cast<int>(type), g.m, g.n, g.k, static_cast<int>(g.epilogue),
                    static_cast<int>(g.trans_a), static_cast<int>(g.trans_b)};
  std::pair<bool, cublasLtMatmulAlgo_t> found{false, {}};
  {
    auto& cache = algo_cache();
    std::lock_guard<std::mutex> lock(cache.mutex);
    auto it = cache.algos.find(key);
    if (it == cache.algos.end()) {
      CUBLASLT_CHECK(cublasLtMatmulPreferenceCreate(&desc.pref));
      CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(desc.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                          &workspace_size, sizeof(workspace_size)));
      cublasLtMatmulHeuristicResult_t result{};
      int returned = 0;
      const cublasStatus_t rc = cublasLtMatmulAlgoGetHeuristic(handle, desc.op, desc.a, desc.b, desc.d, desc.d,
                                                               desc.pref, 1, &result, &returned);
      if (rc == CUBLAS_STATUS_SUCCESS && returned > 0) found = {true, result.algo};
      it = cache.algos.emplace(key, found).first;
    }
    found = it->second;
  }
  if (!found.first) return false;
  const float alpha = 1.0f, beta = 0.0f;
  const auto stream = c10::cuda::getCurrentCUDAStream(device).stream();
  const cublasStatus_t rc = cublasLtMatmul(handle, desc.op, &alpha, g.a, desc.a, g.b, desc.b, &beta, g.d, desc.d, g.d,
                                           desc.d, &found.second, workspace, workspace_size, stream);
  if (rc == CUBLAS_STATUS_NOT_SUPPORTED) return false;  // e.g. buffers less aligned than the cached choice assumed
  if (rc != CUBLAS_STATUS_SUCCESS) ::gpt2::throw_call_error("cublasLtMatmul", cublasLtGetStatusString(rc), __FILE__, __LINE__);
  return true;
}

// Whether every tensor is a contiguous CUDA tensor of x's dtype on x's device.
bool same_kind(const torch::Tensor& x, std::initializer_list<const torch::Tensor*> others, cudaDataType_t* type) {
  if (!x.is_cuda() || !x.is_contiguous() || !dtype_ok(x, type)) return false;
  for (const torch::Tensor* t : others) {
    if (!t->defined() || !t->is_contiguous() || t->scalar_type() != x.scalar_type() || t->device() != x.device()) {
      return false;
    }
  }
  return true;
}

}  // namespace
#endif

bool gemm_bias_gelu(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b, torch::Tensor& out,
                    torch::Tensor& pre) {
#ifdef GPT2_WITH_CUDA
  cudaDataType_t type;
  if (!same_kind(x, {&w, &b, &out, &pre}, &type) || x.dim() != 2) return false;
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  if (N % 8 != 0) return false;  // the GELU input's leading dimension must be a multiple of 8
  // out^T (N, M) = W (N, K) x^T (K, M): A = W read transposed, B = x as stored.
  const LtGemm g{CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, w.data_ptr(), K, x.data_ptr(), K, out.data_ptr(), N,
                 CUBLASLT_EPILOGUE_GELU_AUX_BIAS, b.data_ptr(), pre.data_ptr()};
  return run(g, type, x.device().index());
#else
  (void)x, (void)w, (void)b, (void)out, (void)pre;
  return false;
#endif
}

}  // namespace gpt2::kernels

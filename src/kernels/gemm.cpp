// cuBLASLt GEMMs with per-shape algorithm timing (gemm.h). cuBLASLt is column-major: a row-major
// (R, C) buffer is read as its (C, R) transpose, so row-major d = a b is written as d^T = b^T a^T.
#include "src/kernels/gemm.h"

#include <ATen/ATen.h>

#include <atomic>
#include <stdexcept>

#ifdef GPT2_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <optional>

#include "src/base/cuda_check.h"
#endif

#include "src/base/errors.h"

namespace gpt2::kernels {

// Note [GEMM tuning]
// cuBLAS picks each product's algorithm from a model of the GPU, not by running it. For GPT-2's
// shapes that model is off in places: the weight-gradient products (a small output, K = the
// batch's tokens) run as split-K kernels plus a reduction. Tuning runs, once per shape, ATen's GEMM
// and each algorithm the heuristic lists (it returns them best-first by its own estimate, up to
// kCandidates) on the call's own operands and keeps the fastest, ATen's included, so a tuned
// product is never slower than ATen's by more than the timing noise. A run has a few dozen shapes:
// tuning is part of its first step (tens of milliseconds per shape). A shape first met while its
// stream is being captured into a CUDA graph is not timed (a timing syncs): it runs ATen's GEMM,
// or the heuristic's first choice for the GELU epilogue, and is tuned on its first eager call.
// Within a process a shape always runs the same algorithm, so a run's arithmetic is fixed once
// its shapes are tuned; another process may time a different winner, which sums a product in
// another order. So the trainer keeps each rank's choices in checkpoint.dir (gemm_choices_bytes)
// and a resumed run loads them before its first step: it runs the algorithms of the run it
// continues, and resumes bit for bit. The table is only valid for the cuBLASLt version and GPU
// model that made it (cuBLASLt's algorithm structs may be stored and restored under the same
// library version); another one's table is ignored and the shapes are timed afresh.

namespace {
std::atomic<bool> tuning_on{false};
}  // namespace

void set_gemm_tuning(bool on) { tuning_on = on; }
bool gemm_tuning() { return tuning_on; }

#ifdef GPT2_WITH_CUDA
namespace {

constexpr int kCandidates = 16;
constexpr int kTimedRuns = 5;
constexpr int kRounds = 2;  // every candidate timed in turn, twice; each keeps its faster round

bool lt_type(const torch::Tensor& t, cudaDataType_t* type) {
  switch (t.scalar_type()) {
    case torch::kFloat:
      *type = CUDA_R_32F;
      return true;
    case torch::kBFloat16:
      *type = CUDA_R_16BF;
      return true;
    case torch::kHalf:
      *type = CUDA_R_16F;
      return true;
    case torch::kFloat8_e4m3fn:
      *type = CUDA_R_8F_E4M3;
      return true;
    case torch::kFloat8_e5m2:
      *type = CUDA_R_8F_E5M2;
      return true;
    default:
      return false;
  }
}

// A row-major 2-D operand as cuBLASLt reads it: contiguous (R, C) is the column-major (C, R) with
// leading dimension C, read as stored (N); the transpose of a contiguous (C, R) is that buffer
// read transposed (T) with leading dimension R.
struct Operand {
  const void* ptr = nullptr;
  cublasOperation_t op = CUBLAS_OP_N;
  int64_t ld = 0;
};

bool operand_of(const torch::Tensor& t, Operand* o) {
  if (t.dim() != 2 || t.size(0) == 0 || t.size(1) == 0) return false;
  if (t.stride(1) == 1 && t.stride(0) == t.size(1)) {
    *o = {t.data_ptr(), CUBLAS_OP_N, t.size(1)};
    return true;
  }
  if (t.stride(0) == 1 && t.stride(1) == t.size(0)) {
    *o = {t.data_ptr(), CUBLAS_OP_T, t.size(0)};
    return true;
  }
  return false;
}

int alignment_of(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  int align = 256;
  while (align > 1 && v % align != 0) align /= 2;
  return align;
}

// One column-major product D (m, n) = op(A) (m, k) op(B) (k, n) [+ bias (m), GELU kept in aux]:
// D and the bias of `type`; A and B of theirs (FP8, each with its scale pointer, or `type`).
struct LtGemm {
  cudaDataType_t type, a_type, b_type;
  Operand a, b;
  const void* a_scale = nullptr;  // FP8: the () fp32 value op(A) is multiplied by
  const void* b_scale = nullptr;
  int64_t m, n, k;
  void* d;
  int64_t ldd;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  void* aux = nullptr;  // the GELU input, (m, n) with leading dimension ldd
  int device;
};

// The row-major d (M, N) = a (M, K) b (K, N) as LtGemm: A = b's operand, B = a's.
std::optional<LtGemm> describe(const torch::Tensor& a, const torch::Tensor& b, torch::Tensor& d) {
  LtGemm g{};
  if (!lt_type(d, &g.type) || !lt_type(b, &g.a_type) || !lt_type(a, &g.b_type) || !d.is_contiguous() ||
      !operand_of(b, &g.a) || !operand_of(a, &g.b))
    return std::nullopt;
  g.m = b.size(1);
  g.n = a.size(0);
  g.k = a.size(1);
  g.d = d.data_ptr();
  g.ldd = g.m;
  g.device = a.device().index();
  return g;
}

struct Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  Descriptors() = default;
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;
  ~Descriptors() {
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

void build(const LtGemm& g, Descriptors* desc) {
  CUBLASLT_CHECK(cublasLtMatmulDescCreate(&desc->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(desc->op, CUBLASLT_MATMUL_DESC_TRANSA, &g.a.op, sizeof(g.a.op)));
  CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(desc->op, CUBLASLT_MATMUL_DESC_TRANSB, &g.b.op, sizeof(g.b.op)));
  CUBLASLT_CHECK(
      cublasLtMatmulDescSetAttribute(desc->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &g.epilogue, sizeof(g.epilogue)));
  if (g.bias != nullptr) {
    CUBLASLT_CHECK(
        cublasLtMatmulDescSetAttribute(desc->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias)));
    CUBLASLT_CHECK(
        cublasLtMatmulDescSetAttribute(desc->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &g.type, sizeof(g.type)));
  }
  if (g.aux != nullptr) {
    CUBLASLT_CHECK(
        cublasLtMatmulDescSetAttribute(desc->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux, sizeof(g.aux)));
    CUBLASLT_CHECK(
        cublasLtMatmulDescSetAttribute(desc->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &g.ldd, sizeof(g.ldd)));
  }
  if (g.a_scale != nullptr) {
    CUBLASLT_CHECK(
        cublasLtMatmulDescSetAttribute(desc->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &g.a_scale, sizeof(g.a_scale)));
    CUBLASLT_CHECK(
        cublasLtMatmulDescSetAttribute(desc->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &g.b_scale, sizeof(g.b_scale)));
  }
  const bool ta = g.a.op == CUBLAS_OP_T, tb = g.b.op == CUBLAS_OP_T;
  CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&desc->a, g.a_type, ta ? g.k : g.m, ta ? g.m : g.k, g.a.ld));
  CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&desc->b, g.b_type, tb ? g.n : g.k, tb ? g.k : g.n, g.b.ld));
  CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&desc->d, g.type, g.m, g.n, g.ldd));
}

// What the heuristic sees of a product, so what its choice may depend on. An FP8 product's
// operand types share the type slot (bit 48 marks it), so 16-bit keys, and stored tables, are as
// they were before FP8 products were tuned.
using Key = std::array<int64_t, 14>;
Key key_of(const LtGemm& g) {
  const bool mixed = g.a_type != g.type || g.b_type != g.type;
  const int64_t types = mixed ? static_cast<int64_t>(g.type) | static_cast<int64_t>(g.a_type) << 16 |
                                    static_cast<int64_t>(g.b_type) << 32 | int64_t{1} << 48
                              : static_cast<int64_t>(g.type);
  return {g.device,
          types,
          g.m,
          g.n,
          g.k,
          g.a.ld,
          g.b.ld,
          g.ldd,
          static_cast<int64_t>(g.a.op),
          static_cast<int64_t>(g.b.op),
          static_cast<int64_t>(g.epilogue),
          alignment_of(g.a.ptr),
          alignment_of(g.b.ptr),
          alignment_of(g.d) * 1024 + (g.aux ? alignment_of(g.aux) : 0)};
}

std::vector<cublasLtMatmulAlgo_t> heuristic_algos(const LtGemm& g, const Descriptors& desc, int count) {
  cublasLtMatmulPreference_t pref = nullptr;
  CUBLASLT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const size_t workspace = at::cuda::getCUDABlasLtWorkspaceSize();
  const uint32_t align_a = alignment_of(g.a.ptr), align_b = alignment_of(g.b.ptr), align_d = alignment_of(g.d);
  cublasStatus_t rc = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                           sizeof(workspace));
  if (rc == CUBLAS_STATUS_SUCCESS)
    rc = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                              sizeof(align_a));
  if (rc == CUBLAS_STATUS_SUCCESS)
    rc = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                              sizeof(align_b));
  if (rc == CUBLAS_STATUS_SUCCESS)
    rc = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d,
                                              sizeof(align_d));
  // Split-K partial sums add up in fp32 (the compute type), never in the bf16/fp16 output: summed
  // in the output type, a long-K weight gradient lost half a bit more than ATen's (GemmGpu tests).
  const uint32_t reductions = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  if (rc == CUBLAS_STATUS_SUCCESS)
    rc = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reductions,
                                              sizeof(reductions));
  std::vector<cublasLtMatmulHeuristicResult_t> results(count);
  int returned = 0;
  if (rc == CUBLAS_STATUS_SUCCESS) {
    rc = cublasLtMatmulAlgoGetHeuristic(at::cuda::getCurrentCUDABlasLtHandle(), desc.op, desc.a, desc.b, desc.d, desc.d,
                                        pref, count, results.data(), &returned);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  std::vector<cublasLtMatmulAlgo_t> algos;
  if (rc != CUBLAS_STATUS_SUCCESS) return algos;  // NOT_SUPPORTED: no algorithm for this case
  for (int i = 0; i < returned; ++i) {
    if (results[i].state == CUBLAS_STATUS_SUCCESS) algos.push_back(results[i].algo);
  }
  return algos;
}

cublasStatus_t run_algo(const LtGemm& g, const Descriptors& desc, const cublasLtMatmulAlgo_t& algo) {
  const float alpha = 1.0f, beta = 0.0f;
  const auto stream = c10::cuda::getCurrentCUDAStream(g.device).stream();
  return cublasLtMatmul(at::cuda::getCurrentCUDABlasLtHandle(), desc.op, &alpha, g.a.ptr, desc.a, g.b.ptr, desc.b,
                        &beta, g.d, desc.d, g.d, desc.d, &algo, at::cuda::getCUDABlasLtWorkspace(),
                        at::cuda::getCUDABlasLtWorkspaceSize(), stream);
}

void check_run(cublasStatus_t rc) {
  if (rc != CUBLAS_STATUS_SUCCESS)
    ::gpt2::throw_call_error("cublasLtMatmul", cublasLtGetStatusString(rc), __FILE__, __LINE__);
}

// Milliseconds per run of fn (after one warm-up run), or +inf when fn reports it cannot run.
double time_runs(const std::function<bool()>& fn) {
  if (!fn()) return std::numeric_limits<double>::infinity();
  const auto stream = c10::cuda::getCurrentCUDAStream();
  at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);  // timing events
  start.record(stream);
  for (int i = 0; i < kTimedRuns; ++i) fn();
  stop.record(stream);
  stop.synchronize();
  return start.elapsed_time(stop) / kTimedRuns;
}

// A shape's algorithm: ATen's GEMM (index -1), or one of cuBLASLt's.
struct Choice {
  bool aten = true;
  cublasLtMatmulAlgo_t algo{};
};

struct ChoiceCache {
  std::mutex mutex;
  std::map<Key, std::optional<Choice>> first;  // the heuristic's first choice (nullopt: none)
  std::map<Key, Choice> tuned;
};
ChoiceCache& choice_cache() {
  static ChoiceCache cache;
  return cache;
}

// Times ATen (when `aten` is given) and each heuristic candidate; names and times in that order.
std::vector<GemmCandidateTime> time_candidates(const LtGemm& g, const Descriptors& desc,
                                               const std::vector<cublasLtMatmulAlgo_t>& algos,
                                               const std::function<void()>& aten) {
  std::vector<GemmCandidateTime> times;
  if (aten) times.push_back({"aten", std::numeric_limits<double>::infinity()});
  for (size_t i = 0; i < algos.size(); ++i)
    times.push_back({"lt" + std::to_string(i), std::numeric_limits<double>::infinity()});
  for (int round = 0; round < kRounds; ++round) {
    size_t t = 0;
    if (aten) {
      times[t].ms = std::min(times[t].ms, time_runs([&] {
                               aten();
                               return true;
                             }));
      ++t;
    }
    for (size_t i = 0; i < algos.size(); ++i, ++t) {
      if (round > 0 && times[t].ms == std::numeric_limits<double>::infinity()) continue;  // it failed to run
      times[t].ms =
          std::min(times[t].ms, time_runs([&] { return run_algo(g, desc, algos[i]) == CUBLAS_STATUS_SUCCESS; }));
    }
  }
  for (auto& t : times) {
    if (t.ms == std::numeric_limits<double>::infinity()) t.name = "(skip)";
  }
  return times;
}

bool capturing() {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(c10::cuda::getCurrentCUDAStream().stream(), &status));
  return status != cudaStreamCaptureStatusNone;
}

// The algorithm to run g with, tuned on first use when tuning is on (Note [GEMM tuning]);
// nullopt when there is none (only without an ATen path: the GELU epilogue). Builds cuBLASLt's
// descriptors only for a shape met the first time: a cached choice needs none.
std::optional<Choice> choose(const LtGemm& g, const std::function<void()>& aten) {
  const Key key = key_of(g);
  auto& cache = choice_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  if (tuning_on && !capturing()) {
    auto it = cache.tuned.find(key);
    if (it != cache.tuned.end()) return it->second;
    Descriptors desc;
    build(g, &desc);
    const auto algos = heuristic_algos(g, desc, kCandidates);
    const auto times = time_candidates(g, desc, algos, aten);
    size_t best = 0;
    for (size_t i = 1; i < times.size(); ++i) {
      if (times[i].ms < times[best].ms) best = i;
    }
    if (times.empty() || times[best].ms == std::numeric_limits<double>::infinity()) {
      if (!aten) return std::nullopt;
      return cache.tuned.emplace(key, Choice{}).first->second;
    }
    const size_t lt_index = aten ? best - 1 : best;
    const Choice choice = (aten && best == 0) ? Choice{} : Choice{false, algos[lt_index]};
    return cache.tuned.emplace(key, choice).first->second;
  }
  if (tuning_on) {  // capturing: a shape tuned before keeps its choice
    auto it = cache.tuned.find(key);
    if (it != cache.tuned.end()) return it->second;
  }
  if (aten) return Choice{};
  auto it = cache.first.find(key);
  if (it == cache.first.end()) {
    Descriptors desc;
    build(g, &desc);
    const auto algos = heuristic_algos(g, desc, 1);
    std::optional<Choice> first;
    if (!algos.empty()) first = Choice{false, algos.front()};
    it = cache.first.emplace(key, first).first;
  }
  return it->second;
}

bool tunable(const torch::Tensor& a, std::initializer_list<const torch::Tensor*> others) {
  if (!tuning_on || !a.is_cuda() || (a.scalar_type() != torch::kBFloat16 && a.scalar_type() != torch::kHalf))
    return false;
  for (const torch::Tensor* t : others) {
    if (t->scalar_type() != a.scalar_type() || t->device() != a.device()) return false;
  }
  return true;
}

// d = a b [+ bias] as cuBLASLt sees it; nullopt when a or b is not a plain or transposed matrix.
std::optional<LtGemm> describe_product(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& bias,
                                       torch::Tensor& d) {
  auto g = describe(a, b, d);
  if (g && bias.defined()) {
    g->epilogue = CUBLASLT_EPILOGUE_BIAS;
    g->bias = bias.data_ptr();
  }
  return g;
}

// d = a bᵀ [+ bias] of FP8 a (M, K) and b (N, K), with their scales, as cuBLASLt sees it.
std::optional<LtGemm> describe_fp8(const torch::Tensor& a, const torch::Tensor& a_scale, const torch::Tensor& b,
                                   const torch::Tensor& b_scale, const torch::Tensor& bias, torch::Tensor& d) {
  auto g = describe_product(a, b.t(), bias, d);
  if (g) {  // cuBLASLt's A is b, its B is a
    g->a_scale = b_scale.data_ptr();
    g->b_scale = a_scale.data_ptr();
  }
  return g;
}

// The same product by ATen's GEMM.
void aten_product(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& bias, torch::Tensor& d) {
  bias.defined() ? at::addmm_out(d, bias, a, b) : at::mm_out(d, a, b);
}

// g by the algorithm choose() picks for it: `aten`, the same product by ATen, or cuBLASLt's.
void run_chosen(const LtGemm& g, const std::function<void()>& aten) {
  const auto choice = choose(g, aten);
  if (choice->aten) {
    aten();
    return;
  }
  Descriptors desc;
  build(g, &desc);
  check_run(run_algo(g, desc, choice->algo));
}

// d = a b [+ bias] by the chosen algorithm; false when a or b is not a plain or transposed matrix.
bool tuned_product(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& bias, torch::Tensor& d) {
  const auto g = describe_product(a, b, bias, d);
  if (!g) return false;
  run_chosen(*g, [&] { aten_product(a, b, bias, d); });
  return true;
}

}  // namespace
#endif

torch::Tensor gemm(const torch::Tensor& a, const torch::Tensor& b) {
#ifdef GPT2_WITH_CUDA
  if (tunable(a, {&b}) && a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0)) {
    auto d = torch::empty({a.size(0), b.size(1)}, a.options());
    if (tuned_product(a, b, torch::Tensor(), d)) return d;
  }
#endif
  return at::mm(a, b);
}

torch::Tensor gemm_bias(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias) {
#ifdef GPT2_WITH_CUDA
  if (tunable(x, {&w, &bias}) && x.dim() == 2 && w.dim() == 2 && bias.dim() == 1 && bias.is_contiguous() &&
      x.size(1) == w.size(1) && bias.size(0) == w.size(0)) {
    auto d = torch::empty({x.size(0), w.size(0)}, x.options());
    if (tuned_product(x, w.t(), bias, d)) return d;
  }
#endif
  return at::linear(x, w, bias);
}

torch::Tensor gemm_fp8_nt(const torch::Tensor& a, const torch::Tensor& a_scale, const torch::Tensor& b,
                          const torch::Tensor& b_scale, const torch::Tensor& bias, at::ScalarType out_dtype) {
  auto d = torch::empty({a.size(0), b.size(0)}, a.options().dtype(out_dtype));
  const std::optional<at::Tensor> bias_or = bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt;
  const auto aten = [&] { at::_scaled_mm_out(d, a, b.t(), a_scale, b_scale, bias_or, std::nullopt, out_dtype); };
#ifdef GPT2_WITH_CUDA
  if (tuning_on && a.is_cuda() && (out_dtype == at::kBFloat16 || out_dtype == at::kHalf)) {
    if (const auto g = describe_fp8(a, a_scale, b, b_scale, bias, d)) {
      run_chosen(*g, aten);
      return d;
    }
  }
#endif
  aten();
  return d;
}

bool gemm_bias_gelu(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b, torch::Tensor& out,
                    torch::Tensor& pre) {
#ifdef GPT2_WITH_CUDA
  cudaDataType_t type;
  if (!x.is_cuda() || !x.is_contiguous() || !lt_type(x, &type) || x.dim() != 2) return false;
  for (const torch::Tensor* t : std::initializer_list<const torch::Tensor*>{&w, &b, &out, &pre}) {
    if (!t->defined() || !t->is_contiguous() || t->scalar_type() != x.scalar_type() || t->device() != x.device()) {
      return false;
    }
  }
  if (w.size(0) % 8 != 0) return false;  // the GELU input's leading dimension must be a multiple of 8
  auto g = describe(x, w.t(), out);
  if (!g) return false;
  g->epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  g->bias = b.data_ptr();
  g->aux = pre.data_ptr();
  const auto choice = choose(*g, nullptr);
  if (!choice) return false;
  Descriptors desc;
  build(*g, &desc);
  const cublasStatus_t rc = run_algo(*g, desc, choice->algo);
  if (rc == CUBLAS_STATUS_NOT_SUPPORTED) return false;
  check_run(rc);
  return true;
#else
  (void)x, (void)w, (void)b, (void)out, (void)pre;
  return false;
#endif
}

std::vector<GemmCandidateTime> time_gemm_candidates(const torch::Tensor& a, const torch::Tensor& b,
                                                    const torch::Tensor& bias) {
#ifdef GPT2_WITH_CUDA
  auto d = torch::empty({a.size(0), b.size(1)}, a.options());
  const auto g = describe_product(a, b, bias, d);
  if (!g) throw std::invalid_argument("time_gemm_candidates: a and b must be plain or transposed CUDA matrices");
  Descriptors desc;
  build(*g, &desc);
  return time_candidates(*g, desc, heuristic_algos(*g, desc, kCandidates), [&] { aten_product(a, b, bias, d); });
#else
  (void)a, (void)b, (void)bias;
  throw std::logic_error("time_gemm_candidates: this build has no CUDA");
#endif
}

#ifdef GPT2_WITH_CUDA
namespace {

// "gpt2-gemm-choices 1 <cuBLASLt version> sm<major><minor> <GPU name>\n", then one record per shape.
std::string table_header() {
  const int device = c10::cuda::current_device();
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return "gpt2-gemm-choices 1 " + std::to_string(cublasLtGetVersion()) + " sm" + std::to_string(prop.major) +
         std::to_string(prop.minor) + " " + prop.name + "\n";
}

constexpr size_t kRecordBytes = sizeof(Key) + 1 + sizeof(cublasLtMatmulAlgo_t);

}  // namespace
#endif

std::string gemm_choices_bytes() {
#ifdef GPT2_WITH_CUDA
  auto& cache = choice_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  std::string bytes = table_header();
  for (const auto& [key, choice] : cache.tuned) {
    char record[kRecordBytes];
    std::memcpy(record, key.data(), sizeof(Key));
    record[sizeof(Key)] = choice.aten ? 1 : 0;
    std::memcpy(record + sizeof(Key) + 1, &choice.algo, sizeof(choice.algo));
    bytes.append(record, kRecordBytes);
  }
  return bytes;
#else
  return "";
#endif
}

int64_t load_gemm_choices(const std::string& bytes, const std::string& what) {
  const size_t eol = bytes.find('\n');
  bool whole = bytes.rfind("gpt2-gemm-choices ", 0) == 0 && eol != std::string::npos;
#ifdef GPT2_WITH_CUDA
  whole = whole && (bytes.size() - eol - 1) % kRecordBytes == 0;
#endif
  if (!whole) {
    throw UserError(what +
                    ": not a GEMM tuning table (gpt2-gemm-choices) or a truncated one; delete it and the run "
                    "times its GEMMs afresh");
  }
#ifdef GPT2_WITH_CUDA
  if (bytes.compare(0, eol + 1, table_header()) != 0) return 0;  // another GPU or cuBLASLt: time afresh
  auto& cache = choice_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  int64_t n = 0;
  for (size_t at = eol + 1; at < bytes.size(); at += kRecordBytes, ++n) {
    Key key;
    Choice choice;
    std::memcpy(key.data(), bytes.data() + at, sizeof(Key));
    choice.aten = bytes[at + sizeof(Key)] != 0;
    std::memcpy(&choice.algo, bytes.data() + at + sizeof(Key) + 1, sizeof(choice.algo));
    cache.tuned[key] = choice;
  }
  return n;
#else
  return 0;
#endif
}

void clear_gemm_choices() {
#ifdef GPT2_WITH_CUDA
  auto& cache = choice_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  cache.tuned.clear();
#endif
}

int64_t gemm_choices_count() {
#ifdef GPT2_WITH_CUDA
  auto& cache = choice_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  return static_cast<int64_t>(cache.tuned.size());
#else
  return 0;
#endif
}

}  // namespace gpt2::kernels

// Batch-few decoding's projections (decode_linear.h): the checks, the CUDA launches, and the CPU
// reference in ATen's ops.
#include "src/kernels/decode_linear.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "src/kernels/dtype.h"

#ifdef GPT2_WITH_CUDA
#include "src/base/cuda_check.h"
#include "src/kernels/launch.h"
#endif

namespace gpt2::kernels {
namespace {

[[noreturn]] void refuse(const char* who, const std::string& what) {
  throw std::invalid_argument(std::string("kernels::") + who + ": " + what);
}

std::string shape(const torch::Tensor& t) { return t.defined() ? c10::str(t.sizes()) : "undefined"; }

// The contract's checks common to the three: x (rows, K) against the weight (N, K), the bias, the norm.
void check(const char* who, const torch::Tensor& x, const DecodeNorm& norm, const DecodeWeight& w) {
  if (!x.defined() || x.dim() != 2 || !x.is_contiguous() || x.size(0) < 1 || !is_kernel_dtype(x.scalar_type()))
    refuse(who, "x must be a contiguous (rows, K) fp32/bf16/fp16 tensor, got " + shape(x));
  if (torch::GradMode::is_enabled() && x.requires_grad()) refuse(who, "x must not require grad (decoding only)");
  const int64_t k = x.size(1);
  const auto same = [&](const torch::Tensor& t) {
    return t.device() == x.device() && t.scalar_type() == x.scalar_type();
  };
  if (w.int8 != nullptr) {
    const auto& q = w.int8->q;
    const auto& s = w.int8->scale;
    if (q.dim() != 2 || q.size(1) != k || q.scalar_type() != torch::kChar || !q.is_contiguous() ||
        q.device() != x.device() || s.dim() != 2 || s.size(0) != q.size(0) || s.scalar_type() != torch::kFloat ||
        !s.is_contiguous() || s.device() != x.device() || k % s.size(1) != 0)
      refuse(who, "the int8 weight must be q (N, " + std::to_string(k) +
                      ") int8 and scale (N, G) fp32 on x's device, got " + shape(q) + " and " + shape(s));
  } else if (!w.w.defined() || w.w.dim() != 2 || w.w.size(1) != k || !w.w.is_contiguous() || !same(w.w)) {
    refuse(who, "the weight must be a contiguous (N, " + std::to_string(k) + ") tensor in x's dtype and device, got " +
                    shape(w.w));
  }
  const int64_t n = w.out_features();
  if (w.bias.defined() && (w.bias.dim() != 1 || w.bias.size(0) != n || !w.bias.is_contiguous() || !same(w.bias)))
    refuse(who, "the bias must be (" + std::to_string(n) + ") in x's dtype and device, got " + shape(w.bias));
  if (norm.gamma.defined()) {
    for (const auto* t : {&norm.gamma, &norm.beta})
      if (!t->defined() || t->dim() != 1 || t->size(0) != k || !t->is_contiguous() || !same(*t))
        refuse(who, "the LayerNorm's weight and bias must be (" + std::to_string(k) + ") in x's dtype and device");
  }
  if (x.is_cuda() && (!decode_linear_applies(x.device(), x.scalar_type(), x.size(0), k, w) ||
                      reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 != 0))
    refuse(who, "the CUDA kernel does not take these shapes (rows <= " + std::to_string(kDecodeRows) +
                    ", K a multiple of 16 within shared memory, 16-byte aligned x and weight): x " + shape(x));
  if (!x.is_cuda() && !x.is_cpu()) refuse(who, "x must be on the CPU or a CUDA device");
}

// The CPU reference: the unfused ops, each rounded to x's dtype as they store.
torch::Tensor cpu_product(const torch::Tensor& x, const DecodeNorm& norm, const DecodeWeight& w) {
  const torch::Tensor in =
      norm.gamma.defined() ? at::layer_norm(x, {x.size(1)}, norm.gamma, norm.beta, norm.eps) : x;  // (rows, K)
  return w.int8 != nullptr ? int8_linear(in, *w.int8, w.bias) : at::linear(in, w.w, w.bias);       // (rows, N)
}

#ifdef GPT2_WITH_CUDA
DecodeLinearArgs cuda_args(const torch::Tensor& x, const DecodeNorm& norm, const DecodeWeight& w) {
  DecodeLinearArgs a{};
  a.x = x.data_ptr();
  a.rows = x.size(0);
  a.k = x.size(1);
  a.gamma = norm.gamma.defined() ? norm.gamma.data_ptr() : nullptr;
  a.beta = norm.gamma.defined() ? norm.beta.data_ptr() : nullptr;
  a.eps = static_cast<float>(norm.eps);
  if (w.int8 != nullptr) {
    a.q = w.int8->q.data_ptr<int8_t>();
    a.scale = w.int8->scale.data_ptr<float>();
    a.groups = w.int8->scale.size(1);
  } else {
    a.w = w.w.data_ptr();
  }
  a.bias = w.bias.defined() ? w.bias.data_ptr() : nullptr;
  a.n = w.out_features();
  return a;
}

void launch(const char* who, const torch::Tensor& x, const DecodeLinearArgs& a) {
  CUDA_CHECK(launch_decode_linear(dtype_of(x, who), a, stream_of(x)));
}
#endif

}  // namespace

bool decode_linear_applies(c10::Device device, c10::ScalarType dtype, int64_t rows, int64_t k, const DecodeWeight& w) {
  if (device.is_cpu()) return true;
#ifdef GPT2_WITH_CUDA
  if (!device.is_cuda() || !is_kernel_dtype(dtype)) return false;
  const auto aligned = [](const torch::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; };
  const bool weight = w.int8 != nullptr
                          ? aligned(w.int8->q) && w.int8->scale.dim() == 2 && w.int8->scale.size(1) >= 1 &&
                                k % w.int8->scale.size(1) == 0 && (k / w.int8->scale.size(1)) % 16 == 0
                          : w.w.defined() && aligned(w.w);
  return weight && decode_linear_supported(dtype_of(dtype, "decode_linear"), rows, k);
#else
  (void)dtype, (void)rows, (void)k, (void)w;
  return false;
#endif
}

torch::Tensor decode_linear(const torch::Tensor& x, const DecodeNorm& norm, const DecodeWeight& w, bool gelu) {
  check("decode_linear", x, norm, w);
  if (x.is_cpu()) {
    const torch::Tensor a = cpu_product(x, norm, w);
    return gelu ? at::gelu(a, "tanh") : a;
  }
  auto y = torch::empty({x.size(0), w.out_features()}, x.options());  // (rows, N)
#ifdef GPT2_WITH_CUDA
  DecodeLinearArgs a = cuda_args(x, norm, w);
  a.epilogue = gelu ? DecodeEpilogue::kGelu : DecodeEpilogue::kStore;
  a.y = y.data_ptr();
  launch("decode_linear", x, a);
#endif
  return y;
}

void decode_linear_add_to(const torch::Tensor& x, const DecodeWeight& w, torch::Tensor& stream) {
  check("decode_linear_add_to", x, DecodeNorm{}, w);
  if (!stream.defined() || stream.dim() != 2 || stream.size(0) != x.size(0) || stream.size(1) != w.out_features() ||
      !stream.is_contiguous() || stream.device() != x.device() || stream.scalar_type() != x.scalar_type())
    refuse("decode_linear_add_to", "the stream must be a contiguous (" + std::to_string(x.size(0)) + ", " +
                                       std::to_string(w.out_features()) + ") tensor in x's dtype, got " +
                                       shape(stream));
  if (x.is_cpu()) {
    stream.add_(cpu_product(x, DecodeNorm{}, w));
    return;
  }
#ifdef GPT2_WITH_CUDA
  DecodeLinearArgs a = cuda_args(x, DecodeNorm{}, w);
  a.epilogue = DecodeEpilogue::kAddTo;
  a.y = stream.data_ptr();
  launch("decode_linear_add_to", x, a);
#endif
}

torch::Tensor decode_qkv(const torch::Tensor& x, const DecodeNorm& norm, const DecodeWeight& w, torch::Tensor& keys,
                         torch::Tensor& values, const torch::Tensor& positions) {
  check("decode_qkv", x, norm, w);
  const int64_t rows = x.size(0), n = w.out_features(), c = n / 3;
  if (!keys.defined() || keys.dim() != 4 || n % 3 != 0 || keys.size(0) != rows || keys.size(1) * keys.size(3) != c ||
      !keys.is_contiguous() || !values.defined() || values.sizes() != keys.sizes() || !values.is_contiguous() ||
      keys.device() != x.device() || values.device() != x.device() || keys.scalar_type() != x.scalar_type() ||
      values.scalar_type() != x.scalar_type())
    refuse("decode_qkv",
           "keys and values must be contiguous (" + std::to_string(rows) +
               ", heads, capacity, head_size) with heads * head_size = N / 3 in x's dtype and device, got " +
               shape(keys) + " for N = " + std::to_string(n));
  if (!positions.defined() || positions.dim() != 1 || positions.size(0) != rows ||
      positions.scalar_type() != torch::kLong || !positions.is_contiguous() || positions.device() != x.device())
    refuse("decode_qkv",
           "positions must be (" + std::to_string(rows) + ") int64 on x's device, got " + shape(positions));
  const int64_t heads = keys.size(1), capacity = keys.size(2), hs = keys.size(3);
  if (x.is_cpu()) {
    const torch::Tensor a = cpu_product(x, norm, w);  // (rows, 3C)
    const int64_t* pos = positions.data_ptr<int64_t>();
    for (int64_t r = 0; r < rows; ++r) {
      if (pos[r] < 0 || pos[r] >= capacity)
        refuse("decode_qkv", "positions[" + std::to_string(r) + "] = " + std::to_string(pos[r]) +
                                 " is outside [0, capacity = " + std::to_string(capacity) + ")");
      keys[r].select(1, pos[r]).copy_(a[r].narrow(0, c, c).view({heads, hs}));
      values[r].select(1, pos[r]).copy_(a[r].narrow(0, 2 * c, c).view({heads, hs}));
    }
    return a.narrow(1, 0, c).contiguous();  // (rows, C)
  }
  auto q = torch::empty({rows, c}, x.options());  // (rows, C)
#ifdef GPT2_WITH_CUDA
  DecodeLinearArgs a = cuda_args(x, norm, w);
  a.epilogue = DecodeEpilogue::kQueriesKeysValues;
  a.y = q.data_ptr();
  a.keys = keys.data_ptr();
  a.values = values.data_ptr();
  a.positions = positions.data_ptr<int64_t>();
  a.heads = heads;
  a.capacity = capacity;
  launch("decode_qkv", x, a);
#endif
  return q;
}

torch::Tensor decode_embedding(const torch::Tensor& ids, const torch::Tensor& positions, const DecodeWeight& table,
                               const torch::Tensor& wpe) {
  const char* who = "decode_embedding";
  if (!wpe.defined() || wpe.dim() != 2 || !wpe.is_contiguous() || !is_kernel_dtype(wpe.scalar_type()))
    refuse(who, "wpe must be a contiguous (positions, C) fp32/bf16/fp16 tensor, got " + shape(wpe));
  const int64_t c = wpe.size(1);
  const auto on_device = [&](const torch::Tensor& t) { return t.defined() && t.device() == wpe.device(); };
  for (const auto* t : {&ids, &positions})
    if (!on_device(*t) || t->dim() != 1 || t->scalar_type() != torch::kLong || !t->is_contiguous() ||
        t->size(0) != ids.size(0) || t->size(0) < 1)
      refuse(who, "ids and positions must be (rows) int64 on wpe's device, rows >= 1, got " + shape(ids) + " and " +
                      shape(positions));
  const bool int8 = table.int8 != nullptr;
  const torch::Tensor& rows = int8 ? table.int8->q : table.w;
  if (!on_device(rows) || rows.dim() != 2 || rows.size(1) != c || !rows.is_contiguous() ||
      (int8 ? rows.scalar_type() != torch::kChar || table.int8->scale.dim() != 2 ||
                  table.int8->scale.size(0) != rows.size(0) || table.int8->scale.scalar_type() != torch::kFloat ||
                  !table.int8->scale.is_contiguous() || !on_device(table.int8->scale) ||
                  table.int8->scale.size(1) < 1 || c % table.int8->scale.size(1) != 0
            : rows.scalar_type() != wpe.scalar_type()))
    refuse(who, "the table must be (vocab, " + std::to_string(c) +
                    ") in wpe's dtype, or int8 with (vocab, G) fp32 scales, on wpe's device, got " + shape(rows));
  if (wpe.is_cpu()) {
    const torch::Tensor e =
        int8 ? int8_embedding(ids, *table.int8, wpe.scalar_type()) : table.w.index_select(0, ids);  // (rows, C)
    return e + wpe.index_select(0, positions);
  }
  auto x = torch::empty({ids.size(0), c}, wpe.options());  // (rows, C)
#ifdef GPT2_WITH_CUDA
  DecodeEmbeddingArgs a{};
  a.ids = ids.data_ptr<int64_t>();
  a.positions = positions.data_ptr<int64_t>();
  if (int8) {
    a.q = table.int8->q.data_ptr<int8_t>();
    a.scale = table.int8->scale.data_ptr<float>();
    a.groups = table.int8->scale.size(1);
  } else {
    a.w = table.w.data_ptr();
  }
  a.wpe = wpe.data_ptr();
  a.rows = ids.size(0);
  a.c = c;
  a.vocab = rows.size(0);
  a.max_positions = wpe.size(0);
  a.x = x.data_ptr();
  CUDA_CHECK(launch_decode_embedding(dtype_of(wpe, who), a, stream_of(wpe)));
#else
  refuse(who, "wpe must be on the CPU in a build without CUDA");
#endif
  return x;
}

}  // namespace gpt2::kernels

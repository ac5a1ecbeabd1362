#pragma once
// Raw launchers of the kernels in this folder (*.cu), free of torch headers so nvcc
// compiles them quickly. Contracts: cross_entropy.h, layer_norm.h, linear.h,
// slot_attention.h, fp8_gemm.h, int8_linear.h, decode_linear.h. Every buffer is
// row-major and contiguous; "partial" buffers are fp32 scratch the caller allocates.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace gpt2::kernels {

enum class Dtype { kF32, kF16, kBF16 };

// Where a kernel notes a target outside [0, vocab) that is not ignore_index (Note [Target check] in
// target_check.h): record = {row, position, id, vocab} of target index i = row * positions +
// position, set by the first bad id to arrive while record[0] is -1. record nullptr: nothing noted.
struct BadTargetNote {
  int64_t* record;
  int64_t positions;  // targets per row of the caller's targets (>= 1), for the message
};

// loss[r] = lse[r] - logits[r, targets[r]] (0 when ignored, NaN and noted for an id outside
// [0, vocab)), lse[r] = log sum_j<vocab exp(logits[r, j]).
cudaError_t launch_cross_entropy_forward(Dtype dtype, const void* logits, const int64_t* targets, int64_t rows,
                                         int64_t row_stride, int64_t vocab, int64_t ignore_index, float* loss,
                                         float* lse, BadTargetNote note, cudaStream_t stream);
// grad[r, j] = (exp(logits[r, j] - lse[r]) - [j == targets[r]]) * scale[0] for j < vocab and rows
// whose target is in [0, vocab), 0 otherwise; grad has the logits' dtype and shape (rows,
// row_stride) and may be the logits buffer itself (each element is read before it is written, by
// the same thread).
cudaError_t launch_cross_entropy_backward(Dtype dtype, const void* logits, const int64_t* targets, const float* lse,
                                          const float* scale, int64_t rows, int64_t row_stride, int64_t vocab,
                                          int64_t ignore_index, void* grad, cudaStream_t stream);
// The targets check of the losses without the kernels above: safe[i] = targets[i], or ignore_index
// (noted in `note`) for an id outside [0, vocab) that is not ignore_index; *poison = NaN when there
// was one, else 0. One block: n is a micro-batch's positions.
cudaError_t launch_check_targets(const int64_t* targets, int64_t n, int64_t vocab, int64_t ignore_index,
                                 BadTargetNote note, int64_t* safe, float* poison, cudaStream_t stream);

// LayerNorm over rows x cols. `s` is the normalised input: x in forward, the saved s in backward.
struct LayerNormArgs {
  const void* s;
  const void* gamma;
  const void* beta;  // forward only
  int64_t rows, cols;
};
// Whether the kernels take rows of `cols` elements (they keep a row in registers: up to 2048
// bf16/fp16 or 1024 fp32 columns in 16-byte packs, up to 256 otherwise). The packed path needs
// every buffer 16-byte aligned: for rows over 256 columns the launchers return
// cudaErrorInvalidValue on an unaligned one, so callers pass aligned copies (layer_norm.cpp).
bool layer_norm_supported(Dtype dtype, int64_t cols);
// Forward: with y, s_out = x + y (rounded to dtype) is normalised, else x; out = (s - mean) * rstd
// * gamma + beta; mean and rstd (fp32, per row) are what backward takes.
cudaError_t launch_layer_norm_forward(Dtype dtype, const LayerNormArgs& args, float eps, const void* y, void* s_out,
                                      void* out, float* mean, float* rstd, cudaStream_t stream);
// Backward: dx = LayerNorm input gradient of dout (+ ds when given: the gradient that reached s
// directly), dgamma = sum_r dout * xhat, dbeta = sum_r dout. `partial` holds
// 2 * layer_norm_backward_blocks(rows) * cols floats.
int64_t layer_norm_backward_blocks(int64_t rows);
cudaError_t launch_layer_norm_backward(Dtype dtype, const LayerNormArgs& args, const void* dout, const void* ds,
                                       const float* mean, const float* rstd, void* dx, float* partial, void* dgamma,
                                       void* dbeta, cudaStream_t stream);

// Column sums of a (rows, cols): sums[c] = sum_r a[r, c] (a bias gradient), written in dtype.
// `partial` holds column_sum_chunks(rows) * cols floats.
int64_t column_sum_chunks(int64_t rows);
cudaError_t launch_column_sum(Dtype dtype, const void* a, int64_t rows, int64_t cols, float* partial, void* sums,
                              cudaStream_t stream);
// GELU (tanh) backward with the bias gradient of the layer before it: dpre = dout * gelu'(pre),
// dbias[c] = sum_r dpre[r, c]. `partial` as for launch_column_sum.
cudaError_t launch_gelu_backward(Dtype dtype, const void* dout, const void* pre, int64_t rows, int64_t cols, void* dpre,
                                 float* partial, void* dbias, cudaStream_t stream);

// Slot decoding's attention (slot_attention.h): for every (row b, head h), y[b, h] = sum over
// j <= positions[b] of softmax_j(q[b, h] . k[b, h, j] * scale) v[b, h, j]. q's row b, head h starts
// at b * q_stride_b + h * q_stride_h elements (its hs elements contiguous); keys, values
// (batch, heads, capacity, head_size) and y (batch, heads, head_size) contiguous; a position outside
// [0, capacity) gives a NaN row.
struct SlotAttentionArgs {
  const void* q;
  int64_t q_stride_b, q_stride_h;
  const void* keys;
  const void* values;
  const int64_t* positions;  // (batch), on the device
  int64_t batch, heads, capacity, head_size;
  float scale;
};
// Whether the kernel takes heads of head_size (even, at most 128); keys and values must be aligned
// to two elements (cudaErrorInvalidValue otherwise).
bool slot_attention_supported(int64_t head_size);
cudaError_t launch_slot_attention(Dtype dtype, const SlotAttentionArgs& args, void* y, cudaStream_t stream);

// The per-tensor FP8 casts of fp8_gemm.h (current and delayed scaling), on one stream, no host
// sync (graph-safe). launch_fp8_amax: *amax_bits = the fp32 bits of max |x| over n elements (NaN's
// if any is NaN). launch_fp8_cast: x (rows, cols) scaled by s, saturated to ±top (finite values
// only) and rounded to nearest even into out (rows, cols) in e4m3 or e5m2, and into out_t (cols,
// rows) unless it is nullptr; *scale_inv = 1 / s. s = top / amax (1 where amax is 0 or not finite)
// with amax the value at amax_bits, or, when amax_bits is nullptr, the largest of history[1..
// history_len-1]. record_bits, unless nullptr: atomically raised to max |x|'s fp32 bits, a NaN
// counting as inf (an fp32 >= 0 there: an amax history's current slot). out may be nullptr (the
// transpose only); with gelu, x is replaced by gelu_tanh(x) everywhere above.
struct Fp8CastArgs {
  const void* x;
  int64_t rows, cols;
  bool e5m2;
  float top;
  const unsigned* amax_bits;
  const float* history;
  int64_t history_len;
  unsigned* record_bits;
  void* out;  // nullptr: the transpose only
  void* out_t;
  float* scale_inv;
  bool gelu;  // cast gelu_tanh(x) (ATen's formula, rounded to dtype as ATen's gelu stores it) instead of x
};
// With gelu, the amax of gelu_tanh(x) as launch_fp8_cast computes it.
cudaError_t launch_fp8_amax(Dtype dtype, const void* x, int64_t n, unsigned* amax_bits, cudaStream_t stream,
                            bool gelu = false);
cudaError_t launch_fp8_cast(Dtype dtype, const Fp8CastArgs& args, cudaStream_t stream);
// launch_gelu_backward whose dpre (rounded to dtype, the same bits) is cast as launch_fp8_cast casts
// x into cast.out and cast.out_t instead of stored (cast.x and cast.gelu unused), with the same
// dbias: a 16-bit dtype, rows % 16 == 0, cols % 8 == 0, dout and pre 16-byte, out 8-byte and out_t
// 16-byte aligned; else cudaErrorInvalidValue. With gelu_out, the same pass also writes
// gelu_tanh(pre) in e4m3 to gelu_out->out_t, transposed, as launch_fp8_cast with gelu writes it
// (the scale from gelu_out->history; out and record_bits null, out_t 16-byte aligned).
cudaError_t launch_gelu_backward_fp8(Dtype dtype, const void* dout, const void* pre, int64_t rows, int64_t cols,
                                     const Fp8CastArgs& cast, float* partial, void* dbias, cudaStream_t stream,
                                     const Fp8CastArgs* gelu_out = nullptr);
// The same pass over a (rows, 3 x part_cols) matrix given as its three column blocks, parts[i] with
// row stride strides[i] (elements): cast as launch_fp8_cast casts the concatenation, and its column
// sums into dbias; the parts 16-byte aligned, part_cols and the strides multiples of 8.
cudaError_t launch_parts_fp8(Dtype dtype, const void* const parts[3], const int64_t strides[3], int64_t rows,
                             int64_t part_cols, const Fp8CastArgs& cast, float* partial, void* dbias,
                             cudaStream_t stream);

// Weight-only int8 rows (int8_linear.h): y[r, j] = sum_g scale[j, g] sum_{i in g} q[j, i] x[r, i]
// (+ bias[j]) for r < rows (<= 16), j < n; x, bias, y in `dtype`, fp32 sums; k % 16 == 0 and
// (k / groups) % 16 == 0, else cudaErrorInvalidValue.
cudaError_t launch_int8_gemv(Dtype dtype, const void* x, const int8_t* q, const float* scale, const void* bias, void* y,
                             int64_t rows, int64_t n, int64_t k, int64_t groups, cudaStream_t stream);

// Batch-few decoding's projections (decode_linear.h): for rows r < rows (<= 8) and columns j < n,
// a[r, j] = sum_k in[r, k] W[j, k] + bias[j] in fp32, in = x (rows, k), or with gamma its
// LayerNorm (eps; fp32 statistics) rounded to dtype. W is w (n, k) in dtype, or q (n, k) int8 with
// scale (n, groups) fp32 (W = q * scale[j, k / (k / groups)]). The epilogue writes a rounded once:
// kStore y[r, j] = a; kGelu y[r, j] = gelu_tanh(a); kAddTo y[r, j] += round(a) (y read and written);
// kQueriesKeysValues (n = 3c): j < c into y (rows, c), the rest into keys / values (rows, heads,
// capacity, c / heads) at position positions[r] (none outside [0, capacity)). Every buffer
// contiguous; x and the weight 16-byte aligned; no host sync (graph-safe).
enum class DecodeEpilogue { kStore, kGelu, kAddTo, kQueriesKeysValues };
struct DecodeLinearArgs {
  const void* x;
  int64_t rows, k;
  const void* gamma;  // nullptr: no LayerNorm
  const void* beta;
  float eps;
  const void* w;  // or nullptr with q
  const int8_t* q;
  const float* scale;
  int64_t groups;
  const void* bias;  // nullptr: none
  int64_t n;
  DecodeEpilogue epilogue;
  void* y;
  void* keys;
  void* values;
  const int64_t* positions;
  int64_t heads, capacity;
};
// Whether the kernel takes rows x k inputs (k % 16 == 0, rows <= 8, the staged rows within the
// device's shared memory); the launcher returns cudaErrorInvalidValue for anything it does not take.
bool decode_linear_supported(Dtype dtype, int64_t rows, int64_t k);
cudaError_t launch_decode_linear(Dtype dtype, const DecodeLinearArgs& args, cudaStream_t stream);

// Batch-few decoding's embedding (decode_linear.h): x[r] = E[ids[r]] + wpe[positions[r]] (c
// elements), summed in fp32 and rounded to dtype once, where E is w (vocab, c) in dtype or q (vocab,
// c) int8 with scale (vocab, groups) fp32, each element rounded to dtype after the product (as
// dequantize_int8). An id outside [0, vocab) or a position outside [0, max_positions) makes the
// row NaN. Launched as a programmatic dependent; no host sync (graph-safe).
struct DecodeEmbeddingArgs {
  const int64_t* ids;
  const int64_t* positions;
  const void* w;  // or nullptr with q
  const int8_t* q;
  const float* scale;
  int64_t groups;
  const void* wpe;
  int64_t rows, c, vocab, max_positions;
  void* x;
};
cudaError_t launch_decode_embedding(Dtype dtype, const DecodeEmbeddingArgs& args, cudaStream_t stream);

// The whole decode step of a GPT-2 for rows <= 8 in one cooperative kernel (decode_step.h): every
// layer's decode_linear phases (qkv with ln_1 and the cache write, attn proj added to x, c_fc with
// ln_2 and GELU into h, mlp proj added to x) and its slot attention (q into y), a grid barrier
// between phases, then ln_f and the head into logits (rows, vocab). Each phase computes what the
// kernels above compute for it, so the bits are theirs. A weight: w (n, k) in dtype, or with int8 q
// (n, k) int8 and scale (n, groups) fp32, and an optional bias. barrier: one unsigned, zero at the
// launch. x (rows, c) is the stream, updated in place; q, y (rows, c) and h (rows, 4c) are scratch.
inline constexpr int kDecodeStepMaxLayers = 64;
struct DecodeStepWeight {
  const void* w;  // or the int8 q
  const float* scale;
  int64_t groups;
  const void* bias;
};
struct DecodeStepLayer {
  const void* ln_1_gamma;
  const void* ln_1_beta;
  DecodeStepWeight c_attn, attn_proj;
  const void* ln_2_gamma;
  const void* ln_2_beta;
  DecodeStepWeight c_fc, mlp_proj;
  void* keys;  // (rows, heads, capacity, c / heads)
  void* values;
};
struct DecodeStepArgs {
  int64_t rows, c, heads, capacity, layers, vocab;
  bool int8;         // every weight (blocks and head) int8, or none
  float eps, scale;  // the LayerNorms' eps; the attention's 1 / sqrt(head size)
  void* x;
  void* q;
  void* y;
  void* h;
  void* logits;
  const int64_t* positions;
  unsigned* barrier;
  unsigned long long* trace;  // nullptr, or (layers * 5 + 1) * 3 * grid timestamps (kernel_bench)
  const void* ln_f_gamma;
  const void* ln_f_beta;
  DecodeStepWeight head;
  DecodeStepLayer layer[kDecodeStepMaxLayers];
};
// Whether the device and shapes take the one kernel: cooperative launch, rows <= 8, layers <=
// kDecodeStepMaxLayers, c a multiple of 16 with the head size a multiple of 16 / sizeof(dtype) (and
// at most 128), h's rows in shared memory; the launcher returns cudaErrorInvalidValue otherwise (or
// for a cache or weight not 16-byte aligned).
bool decode_step_supported(Dtype dtype, int64_t rows, int64_t c, int64_t heads, int64_t layers);
// The grid the one kernel launches with (blocks, one an SM).
int decode_step_grid();
cudaError_t launch_decode_step(Dtype dtype, const DecodeStepArgs& args, cudaStream_t stream);

}  // namespace gpt2::kernels

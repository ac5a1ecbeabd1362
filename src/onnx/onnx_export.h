#pragma once
// GPT-2 as ONNX graphs, for ONNX Runtime and TensorRT (`gpt2-ckpt export-onnx`). Writes into `dir`:
//   model.onnx            input_ids (batch, sequence) int64 -> logits (batch, sequence, vocab) fp32
//   model_with_past.onnx  the same plus past_key_values.{i}.key / .value (batch, n_head,
//                         past_sequence, head_size) in, present.{i}.key / .value (batch, n_head,
//                         past_sequence + sequence, head_size) out: incremental decoding, positions
//                         continuing from past_sequence (a first call passes an empty past)
//   model.onnx.data       the weights, once, as both graphs' external data (no 2 GB protobuf
//                         limit, and gpt2-1558m's weights stored once), each at a 4 KiB offset
// Opset 17 (ai.onnx), IR version 8. Batch and sequence axes are dynamic; every row has the same
// length (causal attention, no padding mask). Weights and the cache in fp32 or fp16; LayerNorm,
// attention and the head run in the weights' dtype, the logits come out as fp32. The head is tied
// to wte: one initializer, read by Gather and by a Gemm with transB. Both graphs pass shape
// inference (strict, types checked) and onnx::checker before they are renamed into place.
// No torch here: pip LibTorch's include directory carries its own protobuf headers, which clash
// with the system protobuf that libonnx is built on. The caller hands over raw weights.
// Available when the build found libonnx-dev (onnx_export_available()); otherwise write_onnx
// throws gpt2::UserError saying so. An unwritable dir is a gpt2::UserError naming it.
#include <cstdint>
#include <string>
#include <vector>

namespace gpt2::onnx_export {

// One weight under its Hugging Face name ("transformer.h.0.attn.c_attn.weight"), little-endian,
// row-major, in the export dtype. Projections (c_attn, c_proj, c_fc) are (in, out): the layout
// that makes each one a MatMul (the transpose of our Linear's (out, in), Note [Weight layout]).
struct Weight {
  std::string name;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  int64_t bytes = 0;
};

struct GraphShape {
  int64_t n_layer = 0, n_head = 0, n_embd = 0;
  int64_t vocab_size = 0;  // wte may have more (padded) rows; the logits keep vocab_size
  bool fp16 = false;       // weights and cache fp16 (else fp32)
};

bool onnx_export_available();

void write_onnx(const std::string& dir, const GraphShape& shape, const std::vector<Weight>& weights);

}  // namespace gpt2::onnx_export

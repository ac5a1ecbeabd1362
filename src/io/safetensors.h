#pragma once
// Reader and writer for the safetensors format: u64 little-endian header length N, N bytes of JSON
// ({"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}), then
// the raw little-endian tensor bytes (offsets relative to the end of the header).
// Contract: every length and offset is checked against the file before any byte is trusted; a
// malformed file is a gpt2::UserError naming the file (and tensor). Dtypes: F64 F32 F16 BF16 I64
// I32 I16 I8 U8 BOOL.
#include <torch/types.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace gpt2 {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// Reads every tensor (CPU, contiguous) in the order of their data in the file (for our own files,
// the order write_safetensors was given). If `metadata` is given it receives the
// "__metadata__" map (empty when absent).
NamedTensors read_safetensors(const std::string& path, std::map<std::string, std::string>* metadata = nullptr);

// Writes the tensors (any device, any strides; copied to CPU contiguous) in the given order, the
// header padded with spaces to a multiple of 8 bytes, durably (files.h Note [Durable write]): a
// crash never leaves a truncated file under the final name. Names must be unique.
void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// "F32" <-> torch::kFloat etc.; throw gpt2::UserError for dtypes outside the list above.
torch::ScalarType safetensors_dtype(const std::string& name);
std::string safetensors_dtype_name(torch::ScalarType dtype);

}  // namespace gpt2

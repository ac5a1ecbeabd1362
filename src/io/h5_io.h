#pragma once
// HDF5 pieces the checkpoint and model-file code share (the HDF5 C API, src/base/h5_check.h):
// creating a file, writing datasets without modification times (so equal contents give equal
// bytes and CRCs), and reading a range of a 1-D fp32 dataset. Errors are gpt2::UserError naming
// the file, or gpt2::Error from H5_CHECK for calls that should not fail.
// defines: gpt2::h5::{create_h5, write_f32, write_bytes, write_i8, read_f32_range, read_u8_range, read_bytes,
// read_int_attr_or_throw}
#include <cstdint>
#include <string>
#include <vector>

#include "src/base/h5_check.h"

namespace gpt2::h5 {

// Creates (truncates) `path` for writing; UserError naming it, with HDF5's reason, when it cannot.
H5Id create_h5(const std::string& path);

// A dataset `name` of shape `dims` (fp32 little-endian / uint8), written from `data`
// (product(dims) values) and created without a modification time.
void write_f32(hid_t loc, const std::string& name, const float* data, const std::vector<hsize_t>& dims);
void write_bytes(hid_t loc, const std::string& name, const uint8_t* data, hsize_t n);
// An int8 dataset of shape `dims` (int8 model files' weights, model_file.h).
void write_i8(hid_t loc, const std::string& name, const int8_t* data, const std::vector<hsize_t>& dims);

// Elements [from, from + n) of the 1-D fp32 dataset `name` into out (n floats); UserError naming
// `path` when it is missing, not 1-D, or shorter than the range.
void read_f32_range(hid_t file, const char* name, int64_t from, int64_t n, float* out, const std::string& path);
// The same for a 1-D uint8 dataset.
void read_u8_range(hid_t file, const char* name, int64_t from, int64_t n, uint8_t* out, const std::string& path);
// The 1-D uint8 dataset `name`; empty when there is none.
std::vector<uint8_t> read_bytes(hid_t file, const char* name);
// An integer attribute; UserError "PATH: missing attribute 'NAME'" (or not an integer).
int64_t read_int_attr_or_throw(hid_t loc, const char* name, const std::string& path);

}  // namespace gpt2::h5

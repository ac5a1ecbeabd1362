#pragma once
// The model file (.h5): a trained GPT-2's weights outside a training run, read by gpt2-generate,
// train.init_from and export-hf (model_weights.h). One writer and one reader for every producer:
// `gpt2-ckpt consolidate` and `gpt2-ckpt import-hf` (checkpoints hold no model file: their model
// is the shards' fp32 masters; older ones carry a model.h5 that gpt2-ckpt verify still checks).
// Layout: root attributes format = "gpt2-model" (string), format_version, step, source (string:
// where the weights came from) and the model sizes n_layer, n_head, n_embd, vocab_size,
// block_size (int64); one fp32 dataset per parameter, named as GPT2::named_parameters() (HF names),
// in our layout (Linear (out, in), wte with its padding rows). Datasets carry no modification
// times, so the same weights give the same bytes.
// format_version 3 (`gpt2-ckpt quantize`, GPT2::quantize_int8): the tied wte and the blocks'
// projections (c_attn, c_proj, c_fc weights) are int8: instead of NAME, datasets NAME.int8 (N, K)
// int8 and NAME.scale (N, G) fp32 (src/kernels/int8_linear.h), and root attributes quant = "int8"
// and quant_group (0: one scale a row). Only inference reads it (load_model_to_run makes the model
// int8 first). Version 2 (wte in fp32) is refused with a message to quantize again.
// defines: kModelFileFormat, ModelFileInfo, write_model_file, save_model_file, ModelFile, load_model_file
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "src/base/h5_check.h"
#include "src/model/gpt2_model.h"

namespace gpt2 {

inline constexpr char kModelFileFormat[] = "gpt2-model";
inline constexpr int64_t kModelFileVersion = 1;
inline constexpr int64_t kModelFileInt8Version = 3;

// The root attributes besides format and format_version.
struct ModelFileInfo {
  GPT2Config config;
  int64_t step = 0;         // training steps behind the weights
  std::string source;       // a checkpoint directory, an HF directory ("gpt2-train" in older checkpoints)
  int64_t int8_group = -1;  // version 2: quant_group (0: a scale a row); -1: fp32 weights only
};

// Creates `path` (truncating it) and writes a model file: `fill(i, out)` puts parameter i's fp32
// values into `out` (numel(shapes[i]) floats). No temporary file and no sync: the caller wraps
// this in files::write_durably. UserError naming `path` when it cannot be created or written.
// With `int8` (info.int8_group >= 0), those weights go in as NAME.int8 and NAME.scale (version 2).
void write_model_file(const std::string& path, const ModelFileInfo& info, const std::vector<std::string>& names,
                      const std::vector<std::vector<int64_t>>& shapes, const std::function<void(size_t, float*)>& fill,
                      const std::vector<std::pair<std::string, kernels::Int8Weight*>>& int8 = {});

// The model's parameters (widened to fp32) as a model file, written durably (via PATH.tmp); an
// int8 model (GPT2::quantized) as version 2, its emptied weights replaced by their int8 datasets.
void save_model_file(GPT2& model, const std::string& path, int64_t step, const std::string& source);

// Reads a model file (or any HDF5 file; info() says whether it is one). Every problem is a
// gpt2::UserError naming the path.
class ModelFile {
 public:
  explicit ModelFile(const std::string& path);  // opens read-only
  const std::string& path() const { return path_; }
  // The model sizes and step; "PATH: not a gpt2 model file: missing attribute 'n_layer' (...)"
  // when a size is missing; step is 0 when absent. source is not read back (nothing needs it).
  ModelFileInfo info() const;
  // An integer root attribute, or nullopt when it is missing or not an integer.
  std::optional<int64_t> int_attr(const char* name) const;
  // The shape of dataset `name` and whether it is fp32; nullopt when there is no such dataset.
  std::optional<std::vector<int64_t>> shape(const std::string& name, bool* is_f32) const;
  // The whole fp32 dataset `name` into out (numel of its shape).
  void read(const std::string& name, float* out) const;
  // The int8 dataset `name` (an int8 file's NAME.int8), which must have `shape`, into out; UserError
  // naming the file and dataset when it is missing, not int8 or of another shape.
  void read_int8(const std::string& name, const std::vector<int64_t>& shape, int8_t* out) const;

 private:
  std::string path_;
  h5::H5Id file_;
};

// Copies the file's tensors into the model's parameters of the same names (any device and dtype):
// UserError naming the file and the tensor when one is missing, not fp32 or of another shape. An
// int8 file needs a model made int8 with its group (GPT2::empty_int8): its int8 weights are read
// into the model's; an int8 model reads only int8 files (UserError otherwise, naming both).
void load_model_file(GPT2& model, const std::string& path);

}  // namespace gpt2

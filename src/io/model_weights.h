#pragma once
// Where a trained GPT-2 comes from and goes to outside a training run (gpt2-generate, gpt2-ckpt,
// train.init_from). Three kinds of path are accepted wherever weights are read:
//   - a checkpoint: a step_NNNNNNN directory or a checkpoint root (its newest complete step);
//     the model config comes from the manifest, the parameters from the fp32 masters of the
//     optimizer shards (any world size), after every file's size and CRC-32C are verified;
//   - a model file (.h5, model_file.h: what `gpt2-ckpt consolidate` and `import-hf` write);
//   - a Hugging Face directory: config.json + model.safetensors (hf_import.h).
// Every problem is a gpt2::UserError naming the path (and the tensor or key).
#include <cstdint>
#include <string>

#include "src/base/choices.h"
#include "src/model/gpt2_model.h"

namespace gpt2 {

struct WeightsSource {
  enum class Kind { checkpoint, model_file, hf_dir };
  Kind kind = Kind::model_file;
  std::string path;  // the checkpoint directory itself for a checkpoint root
  GPT2Config config;
  int64_t step = 0;                                // training steps behind the weights (0 for Hugging Face)
  DtypeChoice trained_dtype = DtypeChoice::kAuto;  // a checkpoint's precision.dtype; auto (unknown) for the others
  bool files_verified = false;                     // a checkpoint whose files the caller has CRC-checked already
  int64_t int8_group = -1;                         // an int8 model file's quant_group; -1: fp32 weights
  std::string describe() const;                    // "checkpoint runs/ckpt/step_0000100 (step 100)" etc.
};

// Identifies `path` and reads its model config; nothing else is read yet.
WeightsSource find_weights(const std::string& path);

// Copies the weights into `model` (any device and dtype). The model's config must equal the
// source's in every key; a difference is named ("n_layer is 12 in PATH, the model has 4"). A
// checkpoint's files are CRC-checked first unless source.files_verified.
void load_weights(GPT2& model, const WeightsSource& source);

// find_weights + a GPT2 of that config (CPU, fp32) + load_weights.
GPT2 load_model(const std::string& path);

// An int8 group size for `config` (GPT2::quantize_int8): 0 (a scale a row) or a divisor of n_embd,
// which then divides every projection's row; else a gpt2::UserError naming `option` and the value.
void check_int8_group(const GPT2Config& config, int64_t group, const std::string& option);

// A model loaded to run (gpt2-generate, gpt2-eval, gpt2-serve): on `device` (auto: CUDA when there
// is one), in `dtype` (auto: bf16 on CUDA, fp32 on CPU; with `auto_trained`, a checkpoint's own
// training dtype, so gpt2-eval measures what the trainer measured); in eval mode. `quant` int8
// quantizes the tied wte and the blocks' projections on the device (GPT2::quantize_int8, scales per `quant_group`
// columns, 0: a row); an int8 model file is read as int8 whatever `quant` says. gpt2::UserError
// naming --device when CUDA is asked for and none is visible, and --quant_group when it does not
// divide the projections' rows.
struct InferenceModel {
  GPT2 model{nullptr};
  WeightsSource source;
  torch::Device device{torch::kCPU};
  DtypeChoice dtype = DtypeChoice::kFp32;  // resolved
  int64_t int8_group = -1;                 // the model's int8 group (GPT2::quantized); -1: none
};
InferenceModel load_model_to_run(const std::string& path, DeviceChoice device, DtypeChoice dtype,
                                 bool auto_trained = false, QuantChoice quant = QuantChoice::kNone,
                                 int64_t quant_group = 0);

}  // namespace gpt2

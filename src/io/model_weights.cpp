// Weights in and out of checkpoints, model files and Hugging Face directories (model_weights.h).
#include "src/io/model_weights.h"

#include <torch/torch.h>

#include <map>
#include <utility>

#include "src/base/errors.h"
#include "src/base/files.h"
#include "src/io/hf_import.h"
#include "src/io/manifest.h"
#include "src/io/model_file.h"
#include "src/io/resume.h"
#include "src/kernels/dtype.h"

namespace gpt2 {
namespace {

std::string shape_str(torch::IntArrayRef shape) { return c10::str(shape); }  // "[768, 2304]"

bool is_hf_dir(const std::string& dir) {
  return files::is_regular_file(files::join(dir, "config.json")) &&
         files::is_regular_file(files::join(dir, "model.safetensors"));
}

// Copies fp32 values into a parameter of any device and dtype.
void assign(torch::Tensor& param, const torch::Tensor& values) {
  torch::NoGradGuard no_grad;
  param.copy_(values.view(param.sizes()));
}

void load_checkpoint_masters(GPT2& model, const std::string& dir, bool files_verified) {
  const CheckpointManifest m = CheckpointManifest::read(dir);
  std::string damage;
  for (const auto& problem : files_verified ? std::vector<std::string>() : verify_checkpoint_files(m)) {
    if (!problem.empty()) damage += "\n  " + problem;
  }
  if (!damage.empty()) throw UserError("checkpoint " + dir + " is damaged, nothing was loaded:" + damage);
  std::map<std::string, const CheckpointManifest::Param*> by_name;
  for (const auto& p : m.params) by_name[p.name] = &p;
  for (auto& item : model->named_parameters(/*recurse=*/true)) {
    const auto it = by_name.find(item.key());
    if (it == by_name.end()) throw UserError(dir + "/manifest.json: no parameter '" + item.key() + "'");
    const auto& p = *it->second;
    if (p.shape != item.value().sizes().vec()) {
      throw UserError(dir + "/manifest.json: '" + p.name + "' has shape " + shape_str(p.shape) + ", the model needs " +
                      shape_str(item.value().sizes()));
    }
    auto values = torch::empty(p.shape, torch::kFloat);
    read_flat_range(m, "master", p.offset, p.offset + p.numel, values.data_ptr<float>());
    assign(item.value(), values);
  }
}

}  // namespace

std::string WeightsSource::describe() const {
  switch (kind) {
    case Kind::checkpoint:
      return "checkpoint " + path + " (step " + std::to_string(step) + ")";
    case Kind::model_file:
      return "model file " + path + " (step " + std::to_string(step) + ")";
    case Kind::hf_dir:
      return "Hugging Face directory " + path;
  }
  return path;
}

WeightsSource find_weights(const std::string& path) {
  WeightsSource s;
  if (path.empty()) throw UserError("no weights path given");
  if (!files::exists(path)) throw UserError(path + ": no such file or directory");
  if (files::is_regular_file(path)) {
    s.kind = WeightsSource::Kind::model_file;
    s.path = path;
    const ModelFileInfo info = ModelFile(path).info();
    s.config = info.config;
    s.step = info.step;
    s.int8_group = info.int8_group;
  } else if (is_hf_dir(path)) {
    s.kind = WeightsSource::Kind::hf_dir;
    s.path = path;
    s.config = hf_config_from_json(files::join(path, "config.json"));
  } else {
    s.kind = WeightsSource::Kind::checkpoint;
    s.path = find_checkpoint(path);
    if (s.path.empty()) {
      throw UserError(path +
                      ": neither a checkpoint (manifest.json, or step_* directories with one), a model "
                      "file, nor a Hugging Face directory (config.json + model.safetensors)");
    }
    const CheckpointManifest m = CheckpointManifest::read(s.path);
    s.config = m.model_config();
    s.step = m.step;
    s.trained_dtype = parse_choice<DtypeChoice>(files::join(s.path, "manifest.json") + ": dtype", m.dtype);
  }
  s.config.validate();
  return s;
}

void load_weights(GPT2& model, const WeightsSource& source) {
  const GPT2Config& have = model->config();
  for (const auto& [key, field] : kGPT2ConfigKeys) {
    if (have.*field != source.config.*field) {
      throw UserError(key + std::string(" is ") + std::to_string(source.config.*field) + " in " + source.path +
                      ", the model has " + std::to_string(have.*field) + " (model." + key + ")");
    }
  }
  switch (source.kind) {
    case WeightsSource::Kind::checkpoint:
      load_checkpoint_masters(model, source.path, source.files_verified);
      break;
    case WeightsSource::Kind::model_file:
      load_model_file(model, source.path);
      break;
    case WeightsSource::Kind::hf_dir:
      load_hf_weights(model, files::join(source.path, "model.safetensors"));
      break;
  }
}

GPT2 load_model(const std::string& path) {
  const WeightsSource source = find_weights(path);
  GPT2 model(source.config);
  load_weights(model, source);
  return model;
}

void check_int8_group(const GPT2Config& config, int64_t group, const std::string& option) {
  if (group < 0 || (group > 0 && config.n_embd % group != 0)) {
    throw UserError(option + " = " + std::to_string(group) + ": must divide n_embd = " + std::to_string(config.n_embd) +
                    " (0: one scale a row)");
  }
}

InferenceModel load_model_to_run(const std::string& path, DeviceChoice device, DtypeChoice dtype, bool auto_trained,
                                 QuantChoice quant, int64_t quant_group) {
  const bool have_cuda = torch::cuda::is_available();
  if (device == DeviceChoice::kCuda && !have_cuda) throw UserError("--device = cuda: no CUDA device is visible");
  InferenceModel m;
  m.device = (device == DeviceChoice::kCpu || !have_cuda) ? torch::Device(torch::kCPU) : torch::Device(torch::kCUDA);
  m.source = find_weights(path);
  const DtypeChoice trained = m.source.trained_dtype;
  m.dtype = dtype != DtypeChoice::kAuto                     ? dtype
            : auto_trained && trained != DtypeChoice::kAuto ? trained
            : m.device.is_cuda()                            ? DtypeChoice::kBf16
                                                            : DtypeChoice::kFp32;
  m.model = GPT2(m.source.config);
  const auto scalar = kernels::scalar_type_of(m.dtype);
  if (m.source.int8_group >= 0) {  // int8 on disk: the int8 datasets go straight into the device's
    m.model->to(m.device, scalar);
    m.model->empty_int8(m.source.int8_group);
    load_weights(m.model, m.source);
    m.int8_group = m.source.int8_group;
  } else {
    load_weights(m.model, m.source);
    m.model->to(m.device, scalar);
    if (quant == QuantChoice::kInt8) {
      check_int8_group(m.source.config, quant_group, "--quant_group");
      m.model->quantize_int8(quant_group);
      m.int8_group = quant_group;
    }
  }
  m.model->eval();
  return m;
}

}  // namespace gpt2

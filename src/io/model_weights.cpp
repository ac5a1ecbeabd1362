// Weights in and out of checkpoints, model files and Hugging Face directories (model_weights.h).
#include "src/io/model_weights.h"

#include <torch/torch.h>

#include <map>
#include <utility>

#include "src/base/h5_check.h"
#include "src/base/errors.h"
#include "src/base/files.h"
#include "src/io/checkpoint.h"
#include "src/io/hf_import.h"

namespace gpt2 {
namespace {

using h5::H5ErrorSilencer;
using h5::H5Id;

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

void load_model_file(GPT2& model, const std::string& path) {
  H5ErrorSilencer quiet;
  H5Id file = h5::open_h5(path);
  for (auto& item : model->named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    if (!h5::has_link(file.get(), name)) throw UserError(path + ": no dataset '" + name + "'");
    H5Id dset(H5_ID(H5Dopen2(file.get(), name.c_str(), H5P_DEFAULT)), H5Dclose);
    bool f32 = false;
    const auto dims = h5::dataset_dims(dset.get(), &f32);
    const std::vector<int64_t> shape(dims.begin(), dims.end());
    if (!f32) throw UserError(path + ": '" + name + "' is not fp32");
    if (shape != item.value().sizes().vec()) {
      throw UserError(path + ": '" + name + "' has shape " + shape_str(shape) + ", the model needs " +
                      shape_str(item.value().sizes()));
    }
    auto values = torch::empty(shape, torch::kFloat);
    if (values.numel() > 0) {
      H5_CHECK(H5Dread(dset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data_ptr<float>()));
    }
    assign(item.value(), values);
  }
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
      throw UserError(dir + "/manifest.json: '" + p.name + "' has shape " + shape_str(p.shape) +
                      ", the model needs " + shape_str(item.value().sizes()));
    }
    auto values = torch::empty(p.shape, torch::kFloat);
    read_flat_range(m, "master", p.offset, p.offset + p.numel, values.data_ptr<float>());
    assign(item.value(), values);
  }
}

}  // namespace

std::string WeightsSource::describe() const {
  switch (kind) {
    case Kind::checkpoint: return "checkpoint " + path + " (step " + std::to_string(step) + ")";
    case Kind::model_file: return "model file " + path + " (step " + std::to_string(step) + ")";
    case Kind::hf_dir: return "Hugging Face directory " + path;
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
    H5ErrorSilencer quiet;
    H5Id file = h5::open_h5(path);
    std::string why;
    for (const auto& [key, field] : kGPT2ConfigKeys) {
      if (!h5::read_int_attr(file.get(), key, &(s.config.*field), &why)) {
        throw UserError(path + ": not a gpt2 model file: " + why + " (model files come from gpt2-ckpt consolidate or import-hf)");
      }
    }
    if (!h5::read_int_attr(file.get(), "step", &s.step, &why)) s.step = 0;
  } else if (is_hf_dir(path)) {
    s.kind = WeightsSource::Kind::hf_dir;
    s.path = path;
    s.config = hf_config_from_json(files::join(path, "config.json"));
  } else {
    s.kind = WeightsSource::Kind::checkpoint;
    s.path = find_checkpoint(path);
    if (s.path.empty()) {
      throw UserError(path + ": neither a checkpoint (manifest.json, or step_* directories with one), a model "
                      "file, nor a Hugging Face directory (config.json + model.safetensors)");
    }
    const CheckpointManifest m = CheckpointManifest::read(s.path);
    s.config = m.model_config();
    s.step = m.step;
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
    case WeightsSource::Kind::checkpoint: load_checkpoint_masters(model, source.path, source.files_verified); break;
    case WeightsSource::Kind::model_file: load_model_file(model, source.path); break;
    case WeightsSource::Kind::hf_dir: load_hf_weights(model, files::join(source.path, "model.safetensors")); break;
  }
}

GPT2 load_model(const std::string& path) {
  const WeightsSource source = find_weights(path);
  GPT2 model(source.config);
  load_weights(model, source);
  return model;
}

void write_model_file(const std::string& path, const GPT2Config& config, int64_t step, const std::string& source,
                      const std::vector<std::string>& names, const std::vector<std::vector<int64_t>>& shapes,
                      const std::function<void(size_t, float*)>& fill) {
  const std::string tmp = path + ".tmp";
  H5ErrorSilencer quiet;
  try {
    const hid_t fid = H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (fid < 0) {
      const std::string detail = h5::h5_error_detail();
      throw UserError(tmp + ": cannot create" + (detail.empty() ? "" : " (" + detail + ")") +
                      " (does the directory exist and is it writable?)");
    }
    H5Id file(fid, H5Fclose);
    h5::write_string_attr(file.get(), "format", "gpt2-model");
    h5::write_int_attr(file.get(), "format_version", 1);
    h5::write_int_attr(file.get(), "step", step);
    h5::write_string_attr(file.get(), "source", source);
    for (const auto& [key, field] : kGPT2ConfigKeys) h5::write_int_attr(file.get(), key, config.*field);
    std::vector<float> buf;
    for (size_t i = 0; i < names.size(); ++i) {
      int64_t numel = 1;
      for (int64_t d : shapes[i]) numel *= d;
      buf.assign(static_cast<size_t>(numel), 0.0f);
      fill(i, buf.data());
      std::vector<hsize_t> dims(shapes[i].begin(), shapes[i].end());
      H5Id space(H5_ID(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr)), H5Sclose);
      H5Id dset(H5_ID(H5Dcreate2(file.get(), names[i].c_str(), H5T_IEEE_F32LE, space.get(), H5P_DEFAULT,
                                 H5P_DEFAULT, H5P_DEFAULT)),
                H5Dclose);
      if (numel > 0) H5_CHECK(H5Dwrite(dset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()));
    }
    if (H5Fclose(file.release()) < 0) throw UserError(tmp + ": writing failed (disk full?)");
  } catch (...) {
    try {
      files::remove_file(tmp);
    } catch (const std::exception&) {
    }
    throw;
  }
  files::rename_file(tmp, path);
}

void save_model_file(GPT2& model, const std::string& path, int64_t step, const std::string& source) {
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<torch::Tensor> values;
  for (const auto& item : model->named_parameters(/*recurse=*/true)) {
    names.push_back(item.key());
    shapes.push_back(item.value().sizes().vec());
    values.push_back(item.value().detach().to(torch::kCPU, torch::kFloat).contiguous());
  }
  write_model_file(path, model->config(), step, source, names, shapes, [&](size_t i, float* out) {
    std::copy_n(values[i].data_ptr<float>(), values[i].numel(), out);
  });
}

}  // namespace gpt2

// Model file writer and reader (see model_file.h).
#include "src/io/model_file.h"

#include <torch/torch.h>

#include <algorithm>

#include "src/base/errors.h"
#include "src/base/files.h"
#include "src/io/h5_io.h"

namespace gpt2 {

using h5::H5ErrorSilencer;
using h5::H5Id;

void write_model_file(const std::string& path, const ModelFileInfo& info, const std::vector<std::string>& names,
                      const std::vector<std::vector<int64_t>>& shapes,
                      const std::function<void(size_t, float*)>& fill) {
  H5ErrorSilencer quiet;
  H5Id file = h5::create_h5(path);
  h5::write_string_attr(file.get(), "format", kModelFileFormat);
  h5::write_int_attr(file.get(), "format_version", kModelFileVersion);
  h5::write_int_attr(file.get(), "step", info.step);
  h5::write_string_attr(file.get(), "source", info.source);
  for (const auto& [key, field] : kGPT2ConfigKeys) h5::write_int_attr(file.get(), key, info.config.*field);
  std::vector<float> buf;
  for (size_t i = 0; i < names.size(); ++i) {
    int64_t numel = 1;
    for (int64_t d : shapes[i]) numel *= d;
    buf.assign(static_cast<size_t>(numel), 0.0f);
    fill(i, buf.data());
    h5::write_f32(file.get(), names[i], buf.data(), std::vector<hsize_t>(shapes[i].begin(), shapes[i].end()));
  }
  // Closing flushes: a full disk shows up here.
  if (H5Fclose(file.release()) < 0) throw UserError(path + ": writing failed (disk full?)");
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
  files::write_durably(path, [&](const std::string& tmp) {
    write_model_file(tmp, {model->config(), step, source}, names, shapes,
                     [&](size_t i, float* out) { std::copy_n(values[i].data_ptr<float>(), values[i].numel(), out); });
  });
}

ModelFile::ModelFile(const std::string& path) : path_(path) {
  H5ErrorSilencer quiet;
  file_ = h5::open_h5(path);
}

std::optional<int64_t> ModelFile::int_attr(const char* name) const {
  H5ErrorSilencer quiet;
  int64_t v = 0;
  std::string why;
  if (!h5::read_int_attr(file_.get(), name, &v, &why)) return std::nullopt;
  return v;
}

ModelFileInfo ModelFile::info() const {
  H5ErrorSilencer quiet;
  ModelFileInfo info;
  std::string why;
  for (const auto& [key, field] : kGPT2ConfigKeys) {
    if (!h5::read_int_attr(file_.get(), key, &(info.config.*field), &why)) {
      throw UserError(path_ + ": not a gpt2 model file: " + why +
                      " (model files come from gpt2-ckpt consolidate or import-hf)");
    }
  }
  info.step = int_attr("step").value_or(0);
  return info;
}

std::optional<std::vector<int64_t>> ModelFile::shape(const std::string& name, bool* is_f32) const {
  H5ErrorSilencer quiet;
  if (!h5::has_link(file_.get(), name)) return std::nullopt;
  H5Id dset(H5_ID(H5Dopen2(file_.get(), name.c_str(), H5P_DEFAULT)), H5Dclose);
  const auto dims = h5::dataset_dims(dset.get(), is_f32);
  return std::vector<int64_t>(dims.begin(), dims.end());
}

void ModelFile::read(const std::string& name, float* out) const {
  H5ErrorSilencer quiet;
  H5Id dset(H5_ID(H5Dopen2(file_.get(), name.c_str(), H5P_DEFAULT)), H5Dclose);
  H5_CHECK(H5Dread(dset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out));
}

void load_model_file(GPT2& model, const std::string& path) {
  const ModelFile file(path);
  for (auto& item : model->named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    bool f32 = false;
    const auto shape = file.shape(name, &f32);
    if (!shape) throw UserError(path + ": no dataset '" + name + "'");
    if (!f32) throw UserError(path + ": '" + name + "' is not fp32");
    if (*shape != item.value().sizes().vec()) {
      throw UserError(path + ": '" + name + "' has shape " + c10::str(torch::IntArrayRef(*shape)) +
                      ", the model needs " + c10::str(item.value().sizes()));
    }
    auto values = torch::empty(*shape, torch::kFloat);
    if (values.numel() > 0) file.read(name, values.data_ptr<float>());
    torch::NoGradGuard no_grad;
    item.value().copy_(values.view(item.value().sizes()));
  }
}

}  // namespace gpt2

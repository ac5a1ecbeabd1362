// Model file writer and reader (see model_file.h).
#include "src/io/model_file.h"

#include <torch/torch.h>

#include <algorithm>
#include <set>
#include <string>

#include "src/base/errors.h"
#include "src/base/files.h"
#include "src/io/h5_io.h"

namespace gpt2 {

using h5::H5ErrorSilencer;
using h5::H5Id;

void write_model_file(const std::string& path, const ModelFileInfo& info, const std::vector<std::string>& names,
                      const std::vector<std::vector<int64_t>>& shapes, const std::function<void(size_t, float*)>& fill,
                      const std::vector<std::pair<std::string, kernels::Int8Weight*>>& int8) {
  GPT2_ASSERT(int8.empty() == (info.int8_group < 0), "write_model_file: int8 weights need info.int8_group");
  H5ErrorSilencer quiet;
  H5Id file = h5::create_h5(path);
  h5::write_string_attr(file.get(), "format", kModelFileFormat);
  h5::write_int_attr(file.get(), "format_version", int8.empty() ? kModelFileVersion : kModelFileInt8Version);
  if (!int8.empty()) {
    h5::write_string_attr(file.get(), "quant", "int8");
    h5::write_int_attr(file.get(), "quant_group", info.int8_group);
  }
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
  for (const auto& [name, w] : int8) {
    const at::Tensor q = w->q.to(torch::kCPU).contiguous(), scale = w->scale.to(torch::kCPU).contiguous();
    auto dims = [](const at::Tensor& t) { return std::vector<hsize_t>(t.sizes().begin(), t.sizes().end()); };
    h5::write_i8(file.get(), name + ".int8", q.data_ptr<int8_t>(), dims(q));
    h5::write_f32(file.get(), name + ".scale", scale.data_ptr<float>(), dims(scale));
  }
  // Closing flushes: a full disk shows up here.
  if (H5Fclose(file.release()) < 0) throw UserError(path + ": writing failed (disk full?)");
}

void save_model_file(GPT2& model, const std::string& path, int64_t step, const std::string& source) {
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<torch::Tensor> values;
  const auto int8 = model->int8_weights();
  std::set<std::string> int8_names;
  for (const auto& [name, w] : int8) int8_names.insert(name);
  for (const auto& item : model->named_parameters(/*recurse=*/true)) {
    if (int8_names.count(item.key())) continue;  // emptied: written as NAME.int8 and NAME.scale
    names.push_back(item.key());
    shapes.push_back(item.value().sizes().vec());
    values.push_back(item.value().detach().to(torch::kCPU, torch::kFloat).contiguous());
  }
  files::write_durably(path, [&](const std::string& tmp) {
    // The group from mlp.c_proj (K = 4C, the longest rows): one scale there is one scale a row (0),
    // while a group of n_embd gives wte's and c_attn's rows one scale too.
    const kernels::Int8Weight* w = int8.empty() ? nullptr : int8.back().second;
    const int64_t group = w == nullptr ? -1 : w->scale.size(1) == 1 ? 0 : w->group();  // 0: a scale a row
    write_model_file(
        tmp, {model->config(), step, source, group}, names, shapes,
        [&](size_t i, float* out) { std::copy_n(values[i].data_ptr<float>(), values[i].numel(), out); }, int8);
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
  const int64_t version = int_attr("format_version").value_or(kModelFileVersion);
  if (version == 2) {
    throw UserError(path_ +
                    ": an int8 model file of format_version 2 (its wte in fp32); int8 model files are now "
                    "format_version 3 (wte int8 too): run gpt2-ckpt quantize on the fp32 model again");
  }
  if (version == kModelFileInt8Version) {
    info.int8_group = int_attr("quant_group").value_or(-1);
    if (info.int8_group < 0) {
      throw UserError(path_ + ": an int8 model file (format_version " + std::to_string(version) +
                      ") without quant_group");
    }
  }
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

void ModelFile::read_int8(const std::string& name, const std::vector<int64_t>& shape, int8_t* out) const {
  H5ErrorSilencer quiet;
  if (!h5::has_link(file_.get(), name)) throw UserError(path_ + ": no dataset '" + name + "'");
  H5Id dset(H5_ID(H5Dopen2(file_.get(), name.c_str(), H5P_DEFAULT)), H5Dclose);
  H5Id type(H5_ID(H5Dget_type(dset.get())), H5Tclose);
  if (H5Tget_class(type.get()) != H5T_INTEGER || H5Tget_size(type.get()) != 1 || H5Tget_sign(type.get()) != H5T_SGN_2)
    throw UserError(path_ + ": '" + name + "' is not int8");
  bool f32 = false;
  const auto dims = h5::dataset_dims(dset.get(), &f32);
  if (std::vector<int64_t>(dims.begin(), dims.end()) != shape) {
    throw UserError(path_ + ": '" + name + "' has shape " +
                    c10::str(torch::IntArrayRef(std::vector<int64_t>(dims.begin(), dims.end()))) +
                    ", the model needs " + c10::str(torch::IntArrayRef(shape)));
  }
  H5_CHECK(H5Dread(dset.get(), H5T_NATIVE_INT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, out));
}

void load_model_file(GPT2& model, const std::string& path) {
  const ModelFile file(path);
  const int64_t group = file.info().int8_group;
  if ((group >= 0) != model->quantized()) {
    throw UserError(path + (group >= 0 ? ": holds int8 weights (gpt2-ckpt quantize), which only gpt2-generate, "
                                         "gpt2-eval and gpt2-serve read; training and exports need the fp32 model"
                                       : ": holds fp32 weights, and the model reading it is int8"));
  }
  std::set<std::string> int8_names;
  torch::NoGradGuard no_grad;
  for (auto& [name, w] : model->int8_weights()) {
    int8_names.insert(name);
    at::Tensor q = at::empty(w->q.sizes(), at::kChar);
    file.read_int8(name + ".int8", q.sizes().vec(), q.data_ptr<int8_t>());
    bool f32 = false;
    const auto scale_shape = file.shape(name + ".scale", &f32);
    if (!scale_shape || !f32 || *scale_shape != w->scale.sizes().vec()) {
      throw UserError(path + ": '" + name + ".scale' must be fp32 of shape " + c10::str(w->scale.sizes()) +
                      " (quant_group " + std::to_string(group) + ")");
    }
    at::Tensor scale = at::empty(w->scale.sizes(), at::kFloat);
    file.read(name + ".scale", scale.data_ptr<float>());
    w->q.copy_(q);
    w->scale.copy_(scale);
  }
  for (auto& item : model->named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    if (int8_names.count(name)) continue;
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
    item.value().copy_(values.view(item.value().sizes()));
  }
}

}  // namespace gpt2

// Hugging Face GPT-2 interop (see hf_import.h).
#include "src/io/hf_import.h"

#include <cmath>
#include <sstream>
#include <unordered_map>

#include "src/base/errors.h"
#include "src/base/files.h"
#include "src/base/json.h"
#include "src/base/log.h"

namespace gpt2 {
namespace {

constexpr char kPrefix[] = "transformer.";

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string strip_prefix(const std::string& name) {
  return starts_with(name, kPrefix) ? name.substr(sizeof(kPrefix) - 1) : name;
}

// HF stores these as Conv1D (in, out); we store Linear (out, in).
bool is_conv1d_weight(const std::string& name) {
  return ends_with(name, ".c_attn.weight") || ends_with(name, ".c_proj.weight") || ends_with(name, ".c_fc.weight");
}

// Causal-mask buffers that older transformers versions saved with the weights.
bool is_hf_buffer(const std::string& name) {
  return ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias");
}

std::string shape_str(torch::IntArrayRef s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

}  // namespace

GPT2Config hf_config_from_json(const std::string& path) {
  const json::Value root = json::parse(files::read_file(path), path);
  json::as_object(root, path);
  auto key = [&](const char* k) { return path + ": " + k; };
  GPT2Config cfg;
  cfg.n_layer = json::as_int(json::at(root, "n_layer", path), key("n_layer"));
  cfg.n_head = json::as_int(json::at(root, "n_head", path), key("n_head"));
  cfg.n_embd = json::as_int(json::at(root, "n_embd", path), key("n_embd"));
  cfg.vocab_size = json::as_int(json::at(root, "vocab_size", path), key("vocab_size"));
  if (const json::Value* v = json::find(root, "n_positions")) {
    cfg.block_size = json::as_int(*v, key("n_positions"));
  } else {
    cfg.block_size = json::as_int(json::at(root, "n_ctx", path), key("n_ctx"));
  }

  // Settings that would make HF's model compute something ours does not.
  auto unsupported = [&](const std::string& k, const std::string& why) {
    throw UserError(path + ": " + k + " " + why + " is not supported by gpt2-dist's GPT-2");
  };
  if (const json::Value* v = json::find(root, "model_type"); v && json::as_string(*v, key("model_type")) != "gpt2") {
    unsupported("model_type", "'" + json::as_string(*v, "value") + "'");
  }
  if (const json::Value* v = json::find(root, "activation_function")) {
    const std::string& act = json::as_string(*v, key("activation_function"));
    if (act != "gelu_new" && act != "gelu_pytorch_tanh") unsupported("activation_function", "'" + act + "'");
  }
  if (const json::Value* v = json::find(root, "n_inner");
      v && !v->is_null() && json::as_int(*v, key("n_inner")) != 4 * cfg.n_embd) {
    unsupported("n_inner", "(" + std::to_string(json::as_int(*v, "value")) + " != 4*n_embd)");
  }
  if (const json::Value* v = json::find(root, "layer_norm_epsilon");
      v && std::abs(json::as_double(*v, key("layer_norm_epsilon")) - 1e-5) > 1e-12) {
    unsupported("layer_norm_epsilon", "(" + std::to_string(json::as_double(*v, "value")) + ")");
  }
  if (const json::Value* v = json::find(root, "tie_word_embeddings");
      v && !json::as_bool(*v, key("tie_word_embeddings"))) {
    unsupported("tie_word_embeddings", "false");
  }
  if (const json::Value* v = json::find(root, "scale_attn_by_inverse_layer_idx");
      v && json::as_bool(*v, key("scale_attn_by_inverse_layer_idx"))) {
    unsupported("scale_attn_by_inverse_layer_idx", "true");
  }
  if (const json::Value* v = json::find(root, "scale_attn_weights");
      v && !json::as_bool(*v, key("scale_attn_weights"))) {
    unsupported("scale_attn_weights", "false");
  }
  try {
    cfg.validate();
  } catch (const UserError& e) {
    throw UserError(path + ": " + e.what());
  }
  return cfg;
}

void load_hf_state_dict(GPT2& model, const NamedTensors& tensors, const std::string& source) {
  const GPT2Config& cfg = model->config();
  std::unordered_map<std::string, const torch::Tensor*> by_name;  // prefix-stripped HF name
  for (const auto& [name, t] : tensors) {
    if (name == "lm_head.weight" || is_hf_buffer(name)) continue;
    const std::string key = strip_prefix(name);
    if (!by_name.emplace(key, &t).second) {
      throw UserError(source + ": tensor '" + name + "' appears twice (with and without 'transformer.')");
    }
  }

  torch::NoGradGuard no_grad;
  size_t used = 0;
  for (auto& item : model->named_parameters(/*recurse=*/true)) {
    const std::string key = strip_prefix(item.key());
    torch::Tensor& param = item.value();
    auto it = by_name.find(key);
    if (it == by_name.end()) {
      throw UserError(source + ": missing tensor '" + item.key() + "' (model has n_layer=" +
                      std::to_string(cfg.n_layer) + "; does the checkpoint match its config.json?)");
    }
    const torch::Tensor& src = *it->second;
    const bool wte = key == "wte.weight";
    std::vector<int64_t> expected = param.sizes().vec();
    if (is_conv1d_weight(key)) std::swap(expected[0], expected[1]);
    if (wte) expected[0] = cfg.vocab_size;
    if (src.sizes() != torch::IntArrayRef(expected)) {
      throw UserError(source + ": tensor '" + item.key() + "' has shape " + shape_str(src.sizes()) +
                      ", the model expects " + shape_str(expected) +
                      (is_conv1d_weight(key) ? " (HF Conv1D layout, in x out)" : ""));
    }
    if (is_conv1d_weight(key)) {
      param.copy_(src.t());
    } else if (wte) {
      param.narrow(0, 0, cfg.vocab_size).copy_(src);
      param.narrow(0, cfg.vocab_size, cfg.padded_vocab_size() - cfg.vocab_size).zero_();
    } else {
      param.copy_(src);
    }
    ++used;
  }
  if (used != by_name.size()) {
    std::unordered_map<std::string, bool> known;
    for (const auto& item : model->named_parameters(true)) known[strip_prefix(item.key())] = true;
    for (const auto& [name, t] : tensors) {
      if (name == "lm_head.weight" || is_hf_buffer(name)) continue;
      if (!known.count(strip_prefix(name))) {
        throw UserError(source + ": unexpected tensor '" + name + "' (model has n_layer=" +
                        std::to_string(cfg.n_layer) + "; does the checkpoint match its config.json?)");
      }
    }
  }
}

void load_hf_weights(GPT2& model, const std::string& safetensors_path) {
  load_hf_state_dict(model, read_safetensors(safetensors_path), safetensors_path);
}

NamedTensors hf_state_dict(GPT2& model) {
  const GPT2Config& cfg = model->config();
  torch::NoGradGuard no_grad;
  NamedTensors out;
  for (const auto& item : model->named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    torch::Tensor t = item.value().detach();
    if (is_conv1d_weight(name)) {
      t = t.t();
    } else if (strip_prefix(name) == "wte.weight") {
      t = t.narrow(0, 0, cfg.vocab_size);
    }
    out.emplace_back(name, t.to(torch::kCPU).contiguous());
  }
  return out;
}

void save_hf_weights(GPT2& model, const std::string& dir) {
  const GPT2Config& cfg = model->config();
  files::create_directories(dir);

  NamedTensors tensors = hf_state_dict(model);
  const std::string dtype = tensors.front().second.scalar_type() == torch::kBFloat16 ? "bfloat16"
                            : tensors.front().second.scalar_type() == torch::kHalf   ? "float16"
                            : tensors.front().second.scalar_type() == torch::kDouble ? "float64"
                                                                                     : "float32";
  // HF refuses safetensors files whose metadata lacks a known "format".
  write_safetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}});

  // Dropout is written as 0: our model has none, so this is the model that was trained.
  std::ostringstream js;
  js << "{\n"
     << "  \"architectures\": [\"GPT2LMHeadModel\"],\n"
     << "  \"model_type\": \"gpt2\",\n"
     << "  \"n_layer\": " << cfg.n_layer << ",\n"
     << "  \"n_head\": " << cfg.n_head << ",\n"
     << "  \"n_embd\": " << cfg.n_embd << ",\n"
     << "  \"vocab_size\": " << cfg.vocab_size << ",\n"
     << "  \"n_positions\": " << cfg.block_size << ",\n"
     << "  \"n_ctx\": " << cfg.block_size << ",\n"
     << "  \"n_inner\": null,\n"
     << "  \"activation_function\": \"gelu_new\",\n"
     << "  \"layer_norm_epsilon\": 1e-05,\n"
     << "  \"initializer_range\": 0.02,\n"
     << "  \"attn_pdrop\": 0.0,\n"
     << "  \"embd_pdrop\": 0.0,\n"
     << "  \"resid_pdrop\": 0.0,\n"
     << "  \"scale_attn_weights\": true,\n"
     << "  \"scale_attn_by_inverse_layer_idx\": false,\n"
     << "  \"reorder_and_upcast_attn\": false,\n"
     << "  \"tie_word_embeddings\": true,\n";
  if (cfg.vocab_size > 50256) {  // GPT-2's <|endoftext|>, only when the vocab holds it
    js << "  \"bos_token_id\": 50256,\n  \"eos_token_id\": 50256,\n";
  }
  js << "  \"dtype\": " << json::quote(dtype) << "\n}\n";
  files::write_file_durably(dir + "/config.json", js.str());
  log::info("saved Hugging Face GPT-2 (", cfg.n_layer, " layers, ", model->num_parameters(), " parameters) to ", dir);
}

}  // namespace gpt2

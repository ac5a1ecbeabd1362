// Test probe driven by tests/python/test_hf_*.py and test_model_*.py (not a product tool).
//   hf_logits_probe logits HF_DIR IN.safetensors OUT.safetensors
//       loads HF_DIR (config.json + model.safetensors) through hf_import, reads "idx" and "targets"
//       (B, T) int64 from IN, writes "logits" (B, T, V) and "loss" () in fp32 to OUT.
//   hf_logits_probe export HF_DIR OUT_DIR     load HF_DIR, write it back with save_hf_weights.
//   hf_logits_probe count N_LAYER N_HEAD N_EMBD VOCAB BLOCK   print GPT2Config::num_parameters().
#include <torch/torch.h>

#include <iostream>
#include <string>

#include "src/base/errors.h"
#include "src/gpt2_model.h"
#include "src/hf_import.h"
#include "src/safetensors.h"

namespace {

gpt2::GPT2 load(const std::string& dir) {
  gpt2::GPT2 model(gpt2::hf_config_from_json(dir + "/config.json"));
  gpt2::load_hf_weights(model, dir + "/model.safetensors");
  return model;
}

torch::Tensor find(const gpt2::NamedTensors& tensors, const std::string& name) {
  for (const auto& [n, t] : tensors) {
    if (n == name) return t;
  }
  throw gpt2::UserError("probe input lacks tensor '" + name + "'");
}

int run(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "logits" && argc == 5) {
    gpt2::GPT2 model = load(argv[2]);
    const auto in = gpt2::read_safetensors(argv[3]);
    torch::NoGradGuard no_grad;
    const auto idx = find(in, "idx"), targets = find(in, "targets");
    auto logits = model->forward(idx).contiguous().to(torch::kFloat);
    auto loss = model->loss(idx, targets).to(torch::kFloat);
    gpt2::write_safetensors(argv[4], {{"logits", logits}, {"loss", loss}});
    return 0;
  }
  if (mode == "export" && argc == 4) {
    gpt2::GPT2 model = load(argv[2]);
    gpt2::save_hf_weights(model, argv[3]);
    return 0;
  }
  if (mode == "count" && argc == 7) {
    gpt2::GPT2Config cfg;
    cfg.n_layer = std::stoll(argv[2]);
    cfg.n_head = std::stoll(argv[3]);
    cfg.n_embd = std::stoll(argv[4]);
    cfg.vocab_size = std::stoll(argv[5]);
    cfg.block_size = std::stoll(argv[6]);
    cfg.validate();
    std::cout << cfg.num_parameters() << "\n";
    return 0;
  }
  std::cerr << "usage: hf_logits_probe logits HF_DIR IN OUT | export HF_DIR OUT_DIR | "
               "count N_LAYER N_HEAD N_EMBD VOCAB BLOCK\n";
  return gpt2::kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "hf_logits_probe: " << e.what() << "\n";
    return gpt2::kExitFailure;
  }
}

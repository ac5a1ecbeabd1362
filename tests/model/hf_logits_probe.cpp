// Test probe driven by tests/python/test_hf_*.py and test_model_*.py (not a product tool).
//   hf_logits_probe logits MODEL IN.safetensors OUT.safetensors
//       loads MODEL (an HF directory, a checkpoint or a model file: model_weights.h), reads "idx"
//       and "targets" (B, T) int64 from IN, writes "logits" (B, T, V) and "loss" () in fp32 to
//       OUT. Runs in fp32 on the device GPT2_TEST_DEVICE names (default cpu).
//   hf_logits_probe export HF_DIR OUT_DIR     load HF_DIR, write it back with save_hf_weights.
//   hf_logits_probe count N_LAYER N_HEAD N_EMBD VOCAB BLOCK   print GPT2Config::num_parameters().
#include <torch/torch.h>

#include <cstdlib>
#include <iostream>
#include <string>

#include "src/base/errors.h"
#include "src/io/hf_import.h"
#include "src/io/model_weights.h"
#include "src/io/safetensors.h"
#include "src/model/gpt2_model.h"

namespace {

gpt2::GPT2 load(const std::string& path) { return gpt2::load_model(path); }

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
    const char* env_device = std::getenv("GPT2_TEST_DEVICE");
    const torch::Device device(env_device != nullptr && *env_device ? env_device : "cpu");
    model->to(device);
    const auto in = gpt2::read_safetensors(argv[3]);
    torch::NoGradGuard no_grad;
    const auto idx = find(in, "idx").to(device), targets = find(in, "targets").to(device);
    auto logits = model->forward(idx).contiguous().to(torch::kCPU, torch::kFloat);
    auto loss = model->loss(idx, targets).to(torch::kCPU, torch::kFloat);
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

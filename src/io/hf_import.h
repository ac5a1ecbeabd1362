#pragma once
// Hugging Face GPT-2 interop: config.json -> GPT2Config, and model.safetensors <-> GPT2 weights.
// Contract: HF names with or without the "transformer." prefix are accepted; Conv1D weights
// (c_attn, c_proj, c_fc; HF layout (in, out)) are transposed to/from our Linear (out, in) layout
// (Note [Weight layout] in gpt2_model.h); wte has vocab_size rows in HF files, our padding rows stay 0.
// Every mismatch (missing, unexpected, wrong shape) is a gpt2::UserError naming file and tensor.
#include <string>

#include "src/io/safetensors.h"
#include "src/model/gpt2_model.h"

namespace gpt2 {

// Reads n_layer, n_head, n_embd, vocab_size and n_positions (or n_ctx) from an HF config.json.
// Rejects configs our architecture does not reproduce (activation other than tanh GELU, untied
// head, n_inner != 4*n_embd, scale_attn_by_inverse_layer_idx, ...), naming the key.
GPT2Config hf_config_from_json(const std::string& config_json_path);

// Copies HF-named tensors into the model (any device/dtype; values are converted). `source` names
// the origin in errors. "lm_head.weight" (tied) and the attn.bias / attn.masked_bias buffers of
// older checkpoints are ignored.
void load_hf_state_dict(GPT2& model, const NamedTensors& tensors, const std::string& source);

// read_safetensors + load_hf_state_dict.
void load_hf_weights(GPT2& model, const std::string& safetensors_path);

// The model's parameters in HF layout and names ("transformer.*", Conv1D weights (in, out),
// wte cut to vocab_size rows), on CPU, in the model's dtype.
NamedTensors hf_state_dict(GPT2& model);

// Writes DIR/model.safetensors and DIR/config.json (creating DIR) so that
// transformers' GPT2LMHeadModel.from_pretrained(DIR) loads the model.
void save_hf_weights(GPT2& model, const std::string& dir);

}  // namespace gpt2

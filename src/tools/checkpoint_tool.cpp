// gpt2-ckpt's logic (see checkpoint_tool.h). No MPI: the HDF5 C API and the manifest; torch only to
// move weights between layouts (export-hf, import-hf).
#include "src/tools/checkpoint_tool.h"

#include <algorithm>
#include <array>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <ostream>
#include <set>
#include <stdexcept>
#include <utility>

#include "data/bpe_tokenizer.h"
#include "optim/moment_layout.h"
#include "src/base/files.h"
#include "src/base/json.h"
#include "src/base/log.h"
#include "src/io/checkpoint_verify.h"
#include "src/io/hf_import.h"
#include "src/io/model_file.h"
#include "src/io/model_weights.h"
#include "src/io/resume.h"
#include "src/onnx/onnx_export.h"
#include "src/tools/command_line.h"

namespace gpt2::ckpt {
namespace {

constexpr char kUsage[] =
    "usage: gpt2-ckpt inspect PATH [--json]\n"
    "       gpt2-ckpt verify PATH\n"
    "       gpt2-ckpt consolidate PATH --out FILE\n"
    "       gpt2-ckpt export-hf PATH --out DIR\n"
    "       gpt2-ckpt import-hf HF_DIR --out FILE\n"
    "       gpt2-ckpt export-onnx PATH --out DIR [--dtype fp32|fp16] [--tokenizer_dir DIR]\n"
    "       gpt2-ckpt quantize PATH --out FILE [--group N]\n"
    "PATH is a checkpoint directory (it holds manifest.json) or a checkpoint root (checkpoint.dir:\n"
    "the newest complete step_* directory under it is used); export-hf also takes a model FILE,\n"
    "export-onnx and quantize a model FILE or a Hugging Face directory.\n"
    "Runs without MPI.\n"
    "\n"
    "  inspect      step, world size, ZeRO stage, dtype, optimizer moments (fp32 | 8bit), parameter\n"
    "               count, files (size, CRC-32C), shards and their flat ranges, loss scale, model\n"
    "               config; --json: the manifest\n"
    "  verify       every file's size and CRC-32C, the shards' HDF5 contents against the manifest\n"
    "               (8-bit moments: their scales too), their coverage of the flat parameter space\n"
    "               (and the model.h5 that checkpoints\n"
    "               of older versions carry: its parameters and shapes)\n"
    "  consolidate  verifies, then writes FILE (via FILE.tmp): one fp32 dataset per parameter\n"
    "               (Hugging Face names, manifest shapes) from the shards' fp32 masters: a model\n"
    "               file that gpt2-generate and train.init_from read\n"
    "  export-hf    writes DIR/model.safetensors + DIR/config.json (fp32) that transformers'\n"
    "               GPT2LMHeadModel.from_pretrained(DIR) loads\n"
    "  import-hf    reads a Hugging Face GPT-2 directory (config.json + model.safetensors) and\n"
    "               writes a model FILE (fine-tune it with --train.init_from=FILE)\n"
    "  export-onnx  writes DIR/model.onnx (input_ids -> logits), DIR/model_with_past.onnx (with\n"
    "               past and present keys/values, for decoding), their weights DIR/model.onnx.data\n"
    "               and the tokenizer files: ONNX opset 17, checked by onnx::checker\n"
    "  quantize     writes a model FILE whose wte and blocks' projections are int8 (one scale a row, or\n"
    "               one per N columns with --group N): what gpt2-generate, gpt2-eval and gpt2-serve\n"
    "               read as int8 (--quant int8 quantizes the same way when they load)\n"
    "\n"
    "Exit status: 0 good, 1 damaged checkpoint (each problem printed, naming the file),\n"
    "2 usage error or PATH is not a checkpoint.\n";

UserError usage_error(const std::string& what) { return UserError(what + " (see gpt2-ckpt --help)"); }

std::string str(int64_t v) { return std::to_string(v); }

std::string range_str(int64_t b, int64_t e) { return "[" + str(b) + ", " + str(e) + ")"; }

std::string pad_right(const std::string& s, size_t width) {
  return s.size() >= width ? s : s + std::string(width - s.size(), ' ');
}

// ---- JSON, indented: containers of scalars that fit on a line stay on one line.

bool is_scalar(const json::Value& v) { return !v.is_array() && !v.is_object(); }

bool is_flat(const json::Value& v) {
  for (const auto& e : v) {  // the elements of an array, the values of an object
    if (!is_scalar(e) && !(v.is_object() && e.is_array() && is_flat(e))) return false;
  }
  return true;
}

void pretty(const json::Value& v, int indent, std::string& s) {
  if (is_scalar(v)) {
    s += json::dump(v);
    return;
  }
  if (is_flat(v)) {
    std::string one = json::dump(v);
    if (one.size() + static_cast<size_t>(indent) <= 110) {
      // json::dump is compact; add a space after ',' and ':' outside strings for readability.
      std::string spaced;
      bool in_string = false;
      for (size_t i = 0; i < one.size(); ++i) {
        const char c = one[i];
        spaced += c;
        if (in_string) {
          if (c == '\\' && i + 1 < one.size())
            spaced += one[++i];
          else if (c == '"')
            in_string = false;
        } else if (c == '"') {
          in_string = true;
        } else if (c == ',' || c == ':') {
          spaced += ' ';
        }
      }
      s += spaced;
      return;
    }
  }
  const std::string in(static_cast<size_t>(indent) + 2, ' ');
  const bool array = v.is_array();
  if (v.empty()) {
    s += array ? "[]" : "{}";
    return;
  }
  s += array ? "[\n" : "{\n";
  size_t i = 0;
  for (const auto& item : v.items()) {
    s += in + (array ? "" : json::quote(item.key()) + ": ");
    pretty(item.value(), indent + 2, s);
    s += ++i < v.size() ? ",\n" : "\n";
  }
  s += std::string(static_cast<size_t>(indent), ' ') + (array ? "]" : "}");
}

}  // namespace

// ------------------------------------------------------------------------------------ public

Damaged::Damaged(std::vector<std::string> problems)
    : Error(problems.empty() ? std::string("damaged checkpoint") : problems.front()), problems_(std::move(problems)) {}

std::string resolve_checkpoint(const std::string& path) {
  if (path.empty()) throw usage_error("PATH is empty");
  if (!files::exists(path)) throw UserError(path + ": no such file or directory");
  if (!files::is_directory(path)) {
    throw UserError(path + ": not a checkpoint (a checkpoint is a directory holding manifest.json)");
  }
  const std::string dir = find_checkpoint(path);  // throws when `latest` names a missing checkpoint
  if (dir.empty()) {
    throw UserError(files::join(path, "manifest.json") +
                    ": missing: not a checkpoint (no manifest.json, and no complete step_* directory under " + path +
                    ")");
  }
  return dir;
}

CheckpointManifest read_manifest(const std::string& dir) {
  const std::string mf = files::join(dir, "manifest.json");
  if (!files::is_regular_file(mf)) {
    throw UserError(mf + ": missing: not a checkpoint directory (or an incomplete one)");
  }
  try {
    return CheckpointManifest::read(dir);
  } catch (const Error& e) {
    std::string what = e.what();
    if (what.find(mf) == std::string::npos) what = mf + ": " + what;  // every problem names the file
    throw Damaged({what});
  }
}

std::string human_bytes(uint64_t bytes) {
  if (bytes < 1024) return std::to_string(bytes) + " B";
  const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes) / 1024;
  size_t u = 0;
  while (v >= 1024 && u + 1 < sizeof units / sizeof units[0]) {
    v /= 1024;
    ++u;
  }
  char s[48];
  std::snprintf(s, sizeof s, "%.1f %s", v, units[u]);
  return s;
}

std::string inspect_text(const CheckpointManifest& m) {
  std::string s;
  auto line = [&s](const std::string& key, const std::string& value) { s += key + ": " + value + "\n"; };
  line("checkpoint", m.dir);
  line("step", str(m.step));
  line("world size", str(m.world_size));
  line("ZeRO stage", str(m.zero_stage));
  line("offload", m.offload.empty() ? "none" : m.offload);
  line("dtype", m.dtype);
  line("optimizer", m.optimizer == optim::UpdateRule::kMuon
                        ? "muon (the blocks' matrices; shards hold muon_momentum), adamw for the rest"
                        : choice_name(m.optimizer));
  line("optimizer moments", m.optimizer_moments == optim::MomentFormat::k8bit
                                ? "8bit (block-wise, " + str(optim::kQuantBlock) +
                                      " values per absmax; fp32 for tensors under " + str(optim::kMinQuantNumel) +
                                      " values)"
                                : choice_name(m.optimizer_moments));
  line("parameters", str(m.flat_total) + " (flat_total; padded to " + str(m.flat_padded) + ", " +
                         str(static_cast<int64_t>(m.params.size())) + " tensors)");
  char scale[64];
  std::snprintf(scale, sizeof scale, "%g", m.loss_scale);
  line("loss scale", std::string(scale) + " (growth tracker " + str(m.growth_tracker) + ")");
  line("data seed", std::to_string(m.seed));
  uint64_t total = 0;
  size_t width = 0;
  for (const auto& f : m.files) {
    total += f.bytes;
    width = std::max(width, f.name.size());
  }
  line("files", std::to_string(m.files.size()) + ", " + std::to_string(total) + " bytes (" + human_bytes(total) + ")");
  for (const auto& f : m.files) {
    char b[32];
    std::snprintf(b, sizeof b, "%14" PRIu64, f.bytes);
    s += "  " + pad_right(f.name, width) + b + " bytes  " + pad_right("(" + human_bytes(f.bytes) + ")", 12) +
         "  crc32c " + f.crc32c + "\n";
  }
  line("shards", std::to_string(m.shards.size()));
  for (const auto& sh : m.shards) {
    int64_t elements = 0;
    for (const auto& r : sh.ranges) elements += r.size();
    const std::string where = sh.ranges.size() == 1
                                  ? range_str(sh.begin, sh.end)
                                  : std::to_string(sh.ranges.size()) + " ranges from " + range_str(sh.begin, sh.end);
    s += "  " + pad_right(sh.file, width) + "  rank " + str(sh.rank) + "  " + where + "  " + str(elements) +
         " elements\n";
  }
  s += "model config:\n";
  for (const auto& [k, v] : m.config)
    if (k.rfind("model.", 0) == 0) s += "  " + k + " = " + v + "\n";
  return s;
}

std::string inspect_json(const CheckpointManifest& m) {
  std::string s;
  pretty(m.to_json(), 0, s);
  return s + "\n";
}

int64_t consolidate_checkpoint(const CheckpointManifest& m, const std::string& out) {
  auto problems = verify_checkpoint(m);
  if (!problems.empty()) throw Damaged(std::move(problems));
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  int64_t written = 0;
  for (const auto& p : m.params) {
    names.push_back(p.name);
    shapes.push_back(p.shape);
    written += p.numel;
  }
  files::write_durably(out, [&](const std::string& tmp) {
    write_model_file(tmp, {m.model_config(), m.step, m.dir}, names, shapes, [&](size_t i, float* buf) {
      const auto& p = m.params[i];
      read_flat_range(m, "master", p.offset, p.offset + p.numel, buf);
    });
  });
  return written;
}

// `verify ROOT`: every step directory, unfinished save and `latest`, one line each; exit 1 when a
// step directory is damaged or `latest` names one that is not a complete checkpoint.
int verify_root(const std::string& root_dir, std::ostream& out) {
  const CheckpointRoot root = CheckpointRoot::scan(root_dir);
  if (root.complete.empty() && root.incomplete.empty() && root.latest.empty()) {
    throw UserError(files::join(root_dir, "manifest.json") +
                    ": missing: not a checkpoint (no manifest.json, and no "
                    "step_* directory under " +
                    root_dir + ")");
  }
  std::vector<std::pair<int64_t, std::string>> lines;  // by step
  int damaged = 0;
  std::set<std::string> good;
  for (const auto& [step, name] : root.complete) {
    std::vector<std::string> problems;
    uint64_t bytes = 0;
    size_t count = 0;
    try {
      const CheckpointManifest m = read_manifest(files::join(root_dir, name));
      problems = verify_checkpoint(m);
      for (const auto& f : m.files) bytes += f.bytes;
      count = m.files.size();
    } catch (const Damaged& e) {
      problems = e.problems();
    }
    std::string line = problems.empty()
                           ? log::format("OK %s: %zu files, %llu bytes", name.c_str(), count, (unsigned long long)bytes)
                           : log::format("DAMAGED %s: %zu problem(s)", name.c_str(), problems.size());
    for (const auto& p : problems) line += "\n  " + p;
    if (problems.empty()) good.insert(name);
    damaged += problems.empty() ? 0 : 1;
    lines.emplace_back(step, line);
  }
  for (const auto& [step, name] : root.incomplete) {
    lines.emplace_back(step, "DAMAGED " + name + ": no manifest.json (an interrupted save or removal, or damage)");
    ++damaged;
  }
  std::sort(lines.begin(), lines.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& line : lines) out << line.second << "\n";
  for (const auto& name : root.unfinished) {
    out << "UNFINISHED " << name << ": an interrupted save (gpt2-train removes it at its next start)\n";
  }
  const bool latest_ok = root.latest.empty() || good.count(root.latest) > 0;
  if (root.latest.empty()) {
    out << "latest: none\n";
  } else {
    out << "latest names " << root.latest << (latest_ok ? " (OK)" : ", which is not a good checkpoint") << "\n";
  }
  const std::string resume = root.complete.empty() ? "nothing" : root.complete.back().second;
  if (damaged > 0 || !latest_ok) {
    out << "DAMAGED " << root_dir << ": " << damaged << " damaged step director" << (damaged == 1 ? "y" : "ies")
        << (latest_ok ? "" : ", latest") << "; a resume takes " << resume << "\n";
    return kExitFailure;
  }
  out << "OK " << root_dir << ": " << root.complete.size() << " checkpoint(s); a resume takes " << resume << "\n";
  return kExitOk;
}

// gpt2-ckpt's commands, parsed once (src/base/choices.h).
enum class Command { kInspect, kVerify, kConsolidate, kExportHf, kImportHf, kExportOnnx, kQuantize };

}  // namespace gpt2::ckpt

namespace gpt2 {
template <>
struct ChoiceNames<ckpt::Command> {
  using C = ckpt::Command;
  static constexpr std::array<std::pair<C, const char*>, 7> names{{{C::kInspect, "inspect"},
                                                                   {C::kVerify, "verify"},
                                                                   {C::kConsolidate, "consolidate"},
                                                                   {C::kExportHf, "export-hf"},
                                                                   {C::kImportHf, "import-hf"},
                                                                   {C::kExportOnnx, "export-onnx"},
                                                                   {C::kQuantize, "quantize"}}};
};
}  // namespace gpt2

namespace gpt2::ckpt {

// gpt2-ckpt's command line: COMMAND PATH and the options of that command.
struct ToolArgs {
  Command command = Command::kInspect;
  std::string path, out_file;
  bool as_json = false;
  std::string dtype = "fp32", tokenizer_dir;  // export-onnx
  int64_t group = 0;                          // quantize
};

// nullopt when --help was given (printed to `out`).
std::optional<ToolArgs> parse_tool_args(const std::vector<std::string>& args, std::ostream& out) {
  namespace po = boost::program_options;
  ToolArgs a;
  po::options_description options("options");
  options.add_options()("help,h", "this help")("json", po::bool_switch(&a.as_json),
                                               "inspect: print the manifest as JSON")(
      "out", po::value(&a.out_file),
      "consolidate, import-hf: the model FILE to write; export-hf, export-onnx: the DIR")(
      "dtype", po::value(&a.dtype), "export-onnx: the weights' dtype, fp32 or fp16 (default fp32)")(
      "tokenizer_dir", po::value(&a.tokenizer_dir),
      "export-onnx: encoder.json + vocab.bpe to put beside the graphs (default: data/tokenizer/gpt2)")(
      "group", po::value(&a.group), "quantize: one scale per N columns of a weight (default 0: one scale a row)");
  po::options_description hidden;
  std::string word;
  std::vector<std::string> paths;
  hidden.add_options()("command", po::value(&word))("path", po::value(&paths));
  po::positional_options_description positional;
  positional.add("command", 1).add("path", -1);
  po::variables_map vm;
  if (!tools::parse_command_line(args, "gpt2-ckpt", kUsage, options, positional, vm, out, hidden)) return std::nullopt;
  if (word == "help") {
    out << kUsage;
    return std::nullopt;
  }
  if (word.empty()) throw usage_error("no command given: " + choice_list<Command>());
  try {
    a.command = parse_choice<Command>("command", word);
  } catch (const UserError& e) {
    throw usage_error(e.what());
  }
  const bool writes = a.command != Command::kInspect && a.command != Command::kVerify;
  if (a.as_json && a.command != Command::kInspect) throw usage_error(word + ": --json is an option of inspect only");
  if (vm.count("out") && !writes)
    throw usage_error(word + ": --out is an option of consolidate, export-hf, import-hf and export-onnx");
  for (const char* key : {"dtype", "tokenizer_dir"})
    if (vm.count(key) && a.command != Command::kExportOnnx)
      throw usage_error(word + ": --" + key + " is an option of export-onnx only");
  if (vm.count("group") && a.command != Command::kQuantize)
    throw usage_error(word + ": --group is an option of quantize only");
  if (vm.count("out") && a.out_file.empty()) throw usage_error(word + ": --out needs a path");
  if (paths.empty()) throw usage_error(word + ": missing PATH (a checkpoint directory or a checkpoint root)");
  if (paths.size() > 1) {
    throw usage_error(word + ": unexpected argument '" + paths[1] + "' (one PATH only; PATH is " + paths[0] + ")");
  }
  a.path = paths[0];
  if (a.path.empty()) throw usage_error(word + ": PATH is empty");
  if (writes && a.out_file.empty()) {
    const bool dir = a.command == Command::kExportHf || a.command == Command::kExportOnnx;
    throw usage_error(word + ": missing --out " + (dir ? "DIR" : "FILE"));
  }
  return a;
}

// export-onnx: the model's parameters handed to onnx_export.h as raw weights (projections
// transposed to (in, out)), then the tokenizer files copied beside the graphs.
void export_onnx(GPT2& model, const std::string& dir, const ToolArgs& a) {
  const DtypeChoice dtype = parse_choice<DtypeChoice>("--dtype", a.dtype);
  if (dtype != DtypeChoice::kFp32 && dtype != DtypeChoice::kFp16)
    throw usage_error("export-onnx: --dtype " + a.dtype + ": the graphs hold fp32 or fp16 weights");
  if (!onnx_export::onnx_export_available())
    throw UserError(
        "export-onnx: this gpt2-ckpt was built without ONNX (libonnx-dev was not found when CMake "
        "configured it; launch/install-deps.sh installs it)");
  const std::string tokenizer = a.tokenizer_dir.empty() ? data::find_default_tokenizer_dir() : a.tokenizer_dir;
  for (const char* f : {"encoder.json", "vocab.bpe"})
    if (!files::is_regular_file(files::join(tokenizer, f)))
      throw UserError("export-onnx: no " + std::string(f) + " in the tokenizer directory " + tokenizer);
  const GPT2Config& cfg = model->config();
  onnx_export::GraphShape shape{cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.vocab_size, dtype == DtypeChoice::kFp16};
  std::vector<torch::Tensor> keep;
  std::vector<onnx_export::Weight> weights;
  at::NoGradGuard no_grad;
  for (const auto& p : model->named_parameters()) {
    torch::Tensor t = p.value().to(torch::kCPU, dtype == DtypeChoice::kFp16 ? torch::kHalf : torch::kFloat);
    if (t.dim() == 2 && p.key().find(".c_") != std::string::npos) t = t.t();  // c_attn, c_proj, c_fc
    keep.push_back(t.contiguous());
    weights.push_back(
        {p.key(), keep.back().sizes().vec(), keep.back().data_ptr(), static_cast<int64_t>(keep.back().nbytes())});
  }
  onnx_export::write_onnx(dir, shape, weights);
  for (const char* f : {"encoder.json", "vocab.bpe", "LICENSE"}) {
    const std::string from = files::join(tokenizer, f);
    if (files::is_regular_file(from)) files::write_file_durably(files::join(dir, f), files::read_file(from));
  }
}

int run_tool(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  std::optional<Command> parsed_command;  // for the messages of the handlers below
  try {
    const std::optional<ToolArgs> parsed = parse_tool_args(args, out);
    if (!parsed) return kExitOk;
    const Command command = parsed->command;
    parsed_command = command;
    const std::string& path = parsed->path;
    const std::string& out_file = parsed->out_file;
    const bool as_json = parsed->as_json;

    if (command == Command::kImportHf || command == Command::kExportHf || command == Command::kExportOnnx ||
        command == Command::kQuantize) {
      // Weights go through the model (model_weights.h). A checkpoint is verified as `verify` does
      // (exit 1 when damaged), so loading it need not check its files' CRCs a second time.
      std::string from = path;
      bool verified = false;
      const bool checkpoint_or_hf = !files::is_regular_file(path);
      const bool hf_dir = checkpoint_or_hf && files::is_regular_file(files::join(path, "config.json"));
      const bool any_source = command == Command::kExportOnnx || command == Command::kQuantize;
      if ((command == Command::kExportHf || (any_source && !hf_dir)) && checkpoint_or_hf) {
        from = resolve_checkpoint(path);
        auto problems = verify_checkpoint(read_manifest(from));
        if (!problems.empty()) throw Damaged(std::move(problems));
        verified = true;
      }
      WeightsSource source = find_weights(from);
      source.files_verified = verified;
      if (command == Command::kImportHf && source.kind != WeightsSource::Kind::hf_dir) {
        throw usage_error("import-hf: " + path + " is not a Hugging Face directory (config.json + model.safetensors)");
      }
      GPT2 model(source.config);
      load_weights(model, source);
      const int64_t parameters = model->num_parameters();
      if (command == Command::kImportHf) {
        save_model_file(model, out_file, source.step, path);
      } else if (command == Command::kExportOnnx) {
        export_onnx(model, out_file, *parsed);
      } else if (command == Command::kQuantize) {
        try {
          check_int8_group(source.config, parsed->group, "--group");
        } catch (const UserError& e) {
          throw usage_error(std::string("quantize: ") + e.what());
        }
        model->quantize_int8(parsed->group);
        save_model_file(model, out_file, source.step, path);
      } else {
        save_hf_weights(model, out_file);
      }
      out << "wrote " << out_file << ": " << parameters << " parameters"
          << (model->quantized() ? " (wte and the blocks' projections int8)" : "") << " from " << source.describe()
          << "\n";
      return kExitOk;
    }
    if (command == Command::kVerify && files::is_directory(path) &&
        !files::is_regular_file(files::join(path, "manifest.json"))) {
      return verify_root(path, out);
    }
    const std::string dir = resolve_checkpoint(path);
    const CheckpointManifest m = read_manifest(dir);
    if (command == Command::kInspect) {
      out << (as_json ? inspect_json(m) : inspect_text(m));
      return kExitOk;
    }
    if (command == Command::kVerify) {
      const auto problems = verify_checkpoint(m);
      if (!problems.empty()) {
        for (const auto& p : problems) out << p << "\n";
        out << "DAMAGED " << dir << ": " << problems.size() << " problem(s)\n";
        return kExitFailure;
      }
      uint64_t bytes = 0;
      for (const auto& f : m.files) bytes += f.bytes;
      out << "OK " << dir << ": " << m.files.size() << " files, " << bytes << " bytes\n";
      return kExitOk;
    }
    const int64_t n = consolidate_checkpoint(m, out_file);
    out << "wrote " << out_file << ": " << m.params.size() << " tensors, " << n << " fp32 parameters from " << dir
        << " (step " << m.step << ")\n";
    return kExitOk;
  } catch (const Damaged& e) {
    if (parsed_command == Command::kVerify) {
      for (const auto& p : e.problems()) out << p << "\n";
      out << "DAMAGED: " << e.problems().size() << " problem(s)\n";
    } else {
      err << "gpt2-ckpt " << choice_name(*parsed_command) << ": the checkpoint is damaged"
          << (parsed_command == Command::kConsolidate ? ", nothing written" : "") << ":\n";
      for (const auto& p : e.problems()) err << p << "\n";
    }
    return kExitFailure;
  } catch (const UserError& e) {
    err << "gpt2-ckpt: " << e.what() << "\n";
    return kExitUsage;
  } catch (const std::exception& e) {
    err << "gpt2-ckpt" << (parsed_command ? std::string(" ") + choice_name(*parsed_command) : "")
        << " failed: " << error_message(e) << "\n";
    return kExitFailure;
  }
}

}  // namespace gpt2::ckpt

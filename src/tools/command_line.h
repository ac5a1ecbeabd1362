#pragma once
// The command line of the tools (gpt2-data, gpt2-generate, gpt2-eval, gpt2-serve, gpt2-ckpt):
// Boost.Program_options with positional arguments, a malformed line as a gpt2::UserError that
// points at the tool's --help, and --help printing the usage text and the options; run_main, the
// main() of the one-process tools.
#include <boost/program_options.hpp>

#include <iostream>
#include <ostream>
#include <string>
#include <vector>

#include "src/base/choices.h"
#include "src/base/errors.h"
#include "src/train/choice_option.h"

namespace gpt2::tools {

// The value of an option --NAME that takes one of the words of E (src/base/choices.h): parsed into
// *field when the command line is (a gpt2::UserError "--NAME = WORD: must be one of ..." otherwise).
template <typename E>
boost::program_options::typed_value<std::string>* choice_value(const char* name, E* field) {
  return choice_option(std::string("--") + name, field);
}

// --quant and --quant_group, the same in gpt2-generate, gpt2-eval and gpt2-serve
// (load_model_to_run in src/io/model_weights.h).
struct QuantOptions {
  QuantChoice quant = QuantChoice::kNone;
  int64_t group = 0;
};
inline void add_quant_options(boost::program_options::options_description& options, QuantOptions* q) {
  options.add_options()(
      "quant", choice_value("quant", &q->quant),
      "none | int8: the tied wte and the blocks' projections as int8 weights, dequantized as they are read "
      "(an int8 model file from gpt2-ckpt quantize runs as int8 in any case)")(
      "quant_group", boost::program_options::value(&q->group)->default_value(0),
      "int8: one scale per this many columns of a weight (0: one scale a row)");
}

// Parses `args` (the arguments after the program name) into `vm` against `options` (those listed
// by --help) and `hidden` (positional-only). Returns false when --help was given: usage and options
// are printed to `out`, the caller exits 0.
inline bool parse_command_line(const std::vector<std::string>& args, const char* tool, const char* usage,
                               const boost::program_options::options_description& options,
                               const boost::program_options::positional_options_description& positional,
                               boost::program_options::variables_map& vm, std::ostream& out,
                               const boost::program_options::options_description& hidden = {}) {
  namespace po = boost::program_options;
  po::options_description all;
  all.add(options).add(hidden);
  try {
    po::store(po::command_line_parser(args).options(all).positional(positional).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw UserError(std::string(e.what()) + " (see " + tool + " --help)");
  }
  if (vm.count("help")) {
    out << usage << "\n\n" << options << "\n";
    return false;
  }
  return true;
}

// The same over argv, printing --help to stdout.
inline bool parse_command_line(int argc, char** argv, const char* tool, const char* usage,
                               const boost::program_options::options_description& options,
                               const boost::program_options::positional_options_description& positional,
                               boost::program_options::variables_map& vm,
                               const boost::program_options::options_description& hidden = {}) {
  return parse_command_line(std::vector<std::string>(argv + 1, argv + argc), tool, usage, options, positional, vm,
                            std::cout, hidden);
}

// main() of a one-process tool (gpt2-generate, gpt2-serve): run(argc, argv); a gpt2::UserError is
// printed as "<tool>: <message>" and exits 2, any other exception as "<tool> failed: ..." and 1.
template <typename Run>
int run_main(const char* tool, int argc, char** argv, Run&& run) {
  try {
    return run(argc, argv);
  } catch (const UserError& e) {
    std::cerr << tool << ": " << e.what() << "\n";
    return kExitUsage;
  } catch (const std::exception& e) {
    std::cerr << tool << " failed: " << error_message(e) << "\n";
    return kExitFailure;
  }
}

}  // namespace gpt2::tools

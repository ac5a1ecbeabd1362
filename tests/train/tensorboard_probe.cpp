// Test probe driven by tests/python/test_tensorboard.py (not a product tool).
//   tensorboard_probe DIR TAG=VALUE@STEP ...
// writes the scalars into a new event file under DIR through TensorBoardWriter. Consecutive
// arguments with the same step go into one Event (add_scalars), a lone one through add_scalar, so
// both paths are read back by TensorBoard. VALUE is anything strtod takes (nan, inf, 3e-4).
#include <cstdlib>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "src/base/errors.h"
#include "src/train/tensorboard.h"

namespace {

struct Scalar {
  std::string tag;
  double value;
  int64_t step;
};

Scalar parse(const std::string& arg) {
  const size_t at = arg.rfind('@');
  const size_t eq = at == std::string::npos ? std::string::npos : arg.rfind('=', at);
  if (eq == std::string::npos || eq == 0) throw gpt2::UserError("bad scalar '" + arg + "', want TAG=VALUE@STEP");
  const std::string value = arg.substr(eq + 1, at - eq - 1), step = arg.substr(at + 1);
  char* end = nullptr;
  const double v = std::strtod(value.c_str(), &end);
  if (value.empty() || *end != '\0') throw gpt2::UserError("bad value '" + value + "' in '" + arg + "'");
  const long long s = std::strtoll(step.c_str(), &end, 10);
  if (step.empty() || *end != '\0') throw gpt2::UserError("bad step '" + step + "' in '" + arg + "'");
  return {arg.substr(0, eq), v, s};
}

int run(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: tensorboard_probe DIR TAG=VALUE@STEP ...\n";
    return gpt2::kExitUsage;
  }
  std::vector<Scalar> scalars;
  for (int i = 2; i < argc; ++i) scalars.push_back(parse(argv[i]));
  gpt2::TensorBoardWriter tb(argv[1]);
  for (size_t i = 0; i < scalars.size();) {
    size_t j = i + 1;
    while (j < scalars.size() && scalars[j].step == scalars[i].step) ++j;
    if (j == i + 1) {
      tb.add_scalar(scalars[i].tag, scalars[i].value, scalars[i].step);
    } else {
      std::vector<std::pair<std::string, double>> group;
      for (size_t k = i; k < j; ++k) group.emplace_back(scalars[k].tag, scalars[k].value);
      tb.add_scalars(scalars[i].step, group);
    }
    i = j;
  }
  std::cout << tb.path() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const gpt2::UserError& e) {
    std::cerr << "tensorboard_probe: " << e.what() << "\n";
    return gpt2::kExitUsage;
  } catch (const std::exception& e) {
    std::cerr << "tensorboard_probe: " << e.what() << "\n";
    return gpt2::kExitFailure;
  }
}

#include "src/base/errors.h"

namespace gpt2 {

void throw_call_error(const char* call, const std::string& result, const char* file, int line) {
  std::string where = file;
  // Keep the path short and repo-relative in messages.
  for (const char* root : {"/src/", "/data/", "/parallel/", "/optim/", "/tests/"}) {
    auto pos = where.rfind(root);
    if (pos != std::string::npos) {
      where = where.substr(pos + 1);
      break;
    }
  }
  throw Error(std::string(call) + " failed: " + result + " (" + where + ":" + std::to_string(line) + ")");
}

}  // namespace gpt2

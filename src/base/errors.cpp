#include "src/base/errors.h"

#include <cstdlib>
#include <cstring>

namespace gpt2 {

std::string error_message(const std::exception& e) {
  std::string text = e.what();
  const char* show = std::getenv("TORCH_SHOW_CPP_STACKTRACES");
  if (show != nullptr && std::strcmp(show, "1") == 0) return text;
  const size_t trace = text.find("\nException raised from ");
  return trace == std::string::npos ? text : text.substr(0, trace);
}

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

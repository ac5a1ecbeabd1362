#pragma once
// decimal(v): the shortest decimal text that reads back as exactly `v` ("0.0006" for 6e-4, "0.95",
// "25", "1e-08"), for numbers shown to users (option defaults, the resolved config): never the
// binary expansion ("0.00059999999999999995").
#include <string>

namespace gpt2 {

std::string decimal(double v);

}  // namespace gpt2

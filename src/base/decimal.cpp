// Shortest round-trip decimal text (see decimal.h).
#include "src/base/decimal.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace gpt2 {

std::string decimal(double v) {
  char text[32];
  if (std::floor(v) == v && std::fabs(v) < 1e17) {  // whole numbers in full: 900, not 9e+02
    std::snprintf(text, sizeof text, "%.0f", v);
    return text;
  }
  for (int digits = 1; digits <= 17; ++digits) {  // 17 significant digits always read back
    std::snprintf(text, sizeof text, "%.*g", digits, v);
    if (std::strtod(text, nullptr) == v) break;
  }
  return text;
}

}  // namespace gpt2

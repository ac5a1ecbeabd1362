// decimal(): the shortest decimal text that reads back as the same double.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "src/base/decimal.h"

namespace gpt2 {
namespace {

TEST(Decimal, DefaultsReadAsWritten) {
  EXPECT_EQ(decimal(6e-4), "0.0006");
  EXPECT_EQ(decimal(0.95), "0.95");
  EXPECT_EQ(decimal(0.1), "0.1");
  EXPECT_EQ(decimal(25.0), "25");
  EXPECT_EQ(decimal(30.0), "30");  // %.1g alone would say 3e+01
  EXPECT_EQ(decimal(900.0), "900");
  EXPECT_EQ(decimal(1e20), "1e+20");
  EXPECT_EQ(decimal(2.5e6), "2500000");
  EXPECT_EQ(decimal(1e-8), "1e-08");
  EXPECT_EQ(decimal(-2.5), "-2.5");
  EXPECT_EQ(decimal(0.0), "0");
}

TEST(Decimal, RoundTripsAndIsNoLongerThanSeventeenDigits) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> mantissa(-10.0, 10.0);
  std::uniform_int_distribution<int> exponent(-30, 60);
  for (int i = 0; i < 2000; ++i) {
    const double v = std::ldexp(mantissa(rng), exponent(rng));
    const std::string text = decimal(v);
    EXPECT_EQ(std::strtod(text.c_str(), nullptr), v) << text;
    char full[40];
    std::snprintf(full, sizeof full, "%.17g", v);
    EXPECT_LE(text.size(), std::string(full).size()) << text << " vs " << full;
  }
}

}  // namespace
}  // namespace gpt2

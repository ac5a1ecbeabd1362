// For tests/python/test_moments_8bit.py: reads n fp32 values (raw, little-endian) from IN and
// writes to OUT, raw: the signed and the unsigned map (256 fp32 each), then for the signed and the
// unsigned map in turn the codes (n uint8) and the block absmax values (ceil(n / 2048) fp32) of
// optim::quantize_blocks, then their dequantize_blocks (n fp32).
//   moments_8bit_probe IN OUT
#include <cstdio>
#include <fstream>
#include <iterator>
#include <vector>

#include "optim/moments_8bit.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: moments_8bit_probe IN OUT\n");
    return 2;
  }
  std::ifstream in(argv[1], std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.eof() && !in.good()) {
    std::fprintf(stderr, "moments_8bit_probe: cannot read %s\n", argv[1]);
    return 1;
  }
  const int64_t n = static_cast<int64_t>(bytes.size() / sizeof(float));
  std::vector<float> x(static_cast<size_t>(n));
  std::copy(bytes.begin(), bytes.begin() + n * static_cast<int64_t>(sizeof(float)), reinterpret_cast<char*>(x.data()));
  std::ofstream out(argv[2], std::ios::binary);
  const auto put = [&](const void* p, size_t size) {
    out.write(static_cast<const char*>(p), static_cast<std::streamsize>(size));
  };
  for (bool is_signed : {true, false}) put(gpt2::optim::dynamic_map(is_signed).data(), 256 * sizeof(float));
  const int64_t blocks = (n + gpt2::optim::kQuantBlock - 1) / gpt2::optim::kQuantBlock;
  for (bool is_signed : {true, false}) {
    const auto& map = gpt2::optim::quant_table(is_signed);
    std::vector<uint8_t> codes(static_cast<size_t>(n));
    std::vector<float> absmax(static_cast<size_t>(blocks)), back(static_cast<size_t>(n));
    gpt2::optim::quantize_blocks(map, x.data(), n, codes.data(), absmax.data());
    gpt2::optim::dequantize_blocks(map, codes.data(), absmax.data(), n, back.data());
    put(codes.data(), codes.size());
    put(absmax.data(), absmax.size() * sizeof(float));
    put(back.data(), back.size() * sizeof(float));
  }
  return out.good() ? 0 : 1;
}

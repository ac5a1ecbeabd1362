// Writes the seed corpora for tests/fuzz/run.sh: small valid token files (uint16, uint32, empty,
// with a user block), JSON documents and JSON lines, llm.c and raw .bin shards, plus a few
// near-misses. usage: make_seeds OUT_DIR (creates OUT_DIR/{token_file,json,bin_shard}/).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "data/token_file.h"
#include "src/base/files.h"
#include "src/base/h5_check.h"

namespace {

void write_bytes(const std::string& path, const std::string& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) {
    std::perror(path.c_str());
    std::exit(1);
  }
  std::fclose(f);
}

std::string llmc(const std::vector<uint16_t>& tokens, int32_t version = 1) {
  std::string out(1024, '\0');
  const int32_t header[3] = {20240520, version, static_cast<int32_t>(tokens.size())};
  std::memcpy(out.data(), header, sizeof header);
  out.append(reinterpret_cast<const char*>(tokens.data()), 2 * tokens.size());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace gpt2;
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds OUT_DIR\n");
    return 2;
  }
  const std::string out = argv[1];
  for (const char* sub : {"token_file", "json", "bin_shard"}) files::create_directories(files::join(out, sub));
  const std::string tf = files::join(out, "token_file");
  data::write_token_file(tf + "/u16.h5", {15496, 995, 50256, 1, 2, 3}, data::TokenFileAttrs{});
  data::write_token_file(tf + "/empty.h5", {}, data::TokenFileAttrs{});
  data::write_token_file(tf + "/u32.h5", {70000, 1, 99999}, data::TokenFileAttrs{100000, 99999, "big"});
  data::write_token_file(tf + "/bad_id.h5", {1, 2}, data::TokenFileAttrs{3, 2, "tiny"});
  {
    // A user block (the signature at 512) and a chunked dataset: paths the checks must take.
    h5::H5Id fcpl(H5_ID(H5Pcreate(H5P_FILE_CREATE)), H5Pclose);
    H5_CHECK(H5Pset_userblock(fcpl.get(), 512));
    h5::H5Id file(H5_ID(H5Fcreate((tf + "/ublock_chunked.h5").c_str(), H5F_ACC_TRUNC, fcpl.get(), H5P_DEFAULT)),
                  H5Fclose);
    const hsize_t dims[1] = {8}, chunk[1] = {4};
    h5::H5Id space(H5_ID(H5Screate_simple(1, dims, nullptr)), H5Sclose);
    h5::H5Id dcpl(H5_ID(H5Pcreate(H5P_DATASET_CREATE)), H5Pclose);
    H5_CHECK(H5Pset_chunk(dcpl.get(), 1, chunk));
    h5::H5Id dset(
        H5_ID(H5Dcreate2(file.get(), "tokens", H5T_STD_U16LE, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT)),
        H5Dclose);
  }
  const std::string js = files::join(out, "json");
  write_bytes(js + "/doc.json", R"({"a": [1, -2.5e3, true, false, null], "b": {"c": "\u00e9\ud83d\ude80\n"}})");
  write_bytes(js + "/line.jsonl", R"({"text": "Hello world.\n", "id": 7})");
  write_bytes(js + "/nested.json", "[[[[{\"x\": [\"\\\"\"]}]]]]");
  write_bytes(js + "/num.json", "-0.0e-0");
  const std::string bs = files::join(out, "bin_shard");
  write_bytes(bs + "/llmc.bin", llmc({50256, 15496, 995, 50256, 1, 2}));
  write_bytes(bs + "/llmc_empty.bin", llmc({}));
  write_bytes(bs + "/llmc_v2.bin", llmc({1, 2}, 2));
  const std::vector<uint16_t> raw = {1, 2, 3, 50256, 4};
  write_bytes(bs + "/raw.bin", std::string(reinterpret_cast<const char*>(raw.data()), 2 * raw.size()));
  std::printf("seeds written to %s\n", out.c_str());
  return 0;
}

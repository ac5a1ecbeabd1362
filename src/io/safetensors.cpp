// safetensors I/O (see safetensors.h). The format spec is huggingface/safetensors' README.
#include "src/io/safetensors.h"

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <limits>

#include "src/base/errors.h"
#include "src/base/files.h"
#include "src/base/json.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.cpp copies raw bytes and assumes a little-endian host"
#endif

namespace gpt2 {
namespace {

// Same cap as the reference implementation: a larger header is a corrupt length, not a real file.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr char kMetadataKey[] = "__metadata__";

struct DtypeEntry {
  const char* name;
  torch::ScalarType type;
};

constexpr DtypeEntry kDtypes[] = {
    {"F64", torch::kDouble}, {"F32", torch::kFloat}, {"F16", torch::kHalf},  {"BF16", torch::kBFloat16},
    {"I64", torch::kLong},   {"I32", torch::kInt},   {"I16", torch::kShort}, {"I8", torch::kChar},
    {"U8", torch::kByte},    {"BOOL", torch::kBool},
};

[[noreturn]] void bad_file(const std::string& path, const std::string& what) {
  throw UserError(path + ": not a valid safetensors file: " + what);
}

// A header entry after validation; begin/end are relative to the data region.
struct Entry {
  std::string name;
  torch::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t begin, end;
};

Entry parse_entry(const std::string& path, const std::string& name, const json::Value& v, uint64_t data_bytes) {
  const std::string what = path + ": tensor '" + name + "'";
  Entry e;
  e.name = name;
  const std::string& dtype_name = json::as_string(json::at(v, "dtype", what), what + " dtype");
  bool known = false;
  for (const auto& d : kDtypes) {
    if (dtype_name == d.name) {
      e.dtype = d.type;
      known = true;
    }
  }
  if (!known) bad_file(path, "tensor '" + name + "' has unsupported dtype '" + dtype_name + "'");

  // numel * itemsize with overflow checks: a huge shape must be an error, not a wrap-around.
  uint64_t bytes = c10::elementSize(e.dtype);
  for (const auto& dim : json::as_array(json::at(v, "shape", what), what + " shape")) {
    const int64_t d = json::as_int(dim, what + " shape");
    if (d < 0) bad_file(path, "tensor '" + name + "' has a negative dimension");
    if (d != 0 && bytes > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(d)) {
      bad_file(path, "tensor '" + name + "' shape overflows");
    }
    bytes *= static_cast<uint64_t>(d);
    e.shape.push_back(d);
  }
  const auto& offsets = json::as_array(json::at(v, "data_offsets", what), what + " data_offsets");
  if (offsets.size() != 2) bad_file(path, "tensor '" + name + "' data_offsets must be [begin, end]");
  const int64_t b = json::as_int(offsets[0], what + " data_offsets");
  const int64_t en = json::as_int(offsets[1], what + " data_offsets");
  if (b < 0 || en < b) bad_file(path, "tensor '" + name + "' has data_offsets out of order");
  e.begin = static_cast<uint64_t>(b);
  e.end = static_cast<uint64_t>(en);
  if (e.end > data_bytes) {
    bad_file(path, "tensor '" + name + "' data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                       "] run past the end of the data (" + std::to_string(data_bytes) + " bytes)");
  }
  if (e.end - e.begin != bytes) {
    bad_file(path, "tensor '" + name + "' spans " + std::to_string(e.end - e.begin) + " bytes but dtype " + dtype_name +
                       " and its shape need " + std::to_string(bytes));
  }
  return e;
}

}  // namespace

torch::ScalarType safetensors_dtype(const std::string& name) {
  for (const auto& d : kDtypes) {
    if (name == d.name) return d.type;
  }
  throw UserError("unsupported safetensors dtype '" + name + "'");
}

std::string safetensors_dtype_name(torch::ScalarType dtype) {
  for (const auto& d : kDtypes) {
    if (dtype == d.type) return d.name;
  }
  throw UserError(std::string("safetensors cannot store dtype ") + c10::toString(dtype));
}

NamedTensors read_safetensors(const std::string& path, std::map<std::string, std::string>* metadata) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(path + ": cannot open safetensors file");
  in.seekg(0, std::ios::end);
  const uint64_t file_bytes = static_cast<uint64_t>(in.tellg());
  in.seekg(0, std::ios::beg);
  if (file_bytes < 8) bad_file(path, "shorter than the 8-byte header length");

  unsigned char len_bytes[8];
  in.read(reinterpret_cast<char*>(len_bytes), 8);
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | len_bytes[i];  // little-endian
  if (header_bytes > kMaxHeaderBytes || header_bytes > file_bytes - 8) {
    bad_file(path, "header length " + std::to_string(header_bytes) + " exceeds the file (" +
                       std::to_string(file_bytes) + " bytes)");
  }
  std::string header(header_bytes, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_bytes));
  if (!in) bad_file(path, "cannot read the header");
  const uint64_t data_start = 8 + header_bytes;
  const uint64_t data_bytes = file_bytes - data_start;

  // A repeated tensor name is a damaged file: parse refuses it instead of keeping the last.
  const json::Value root = json::parse(header, path + " (header)", json::DuplicateKeys::kReject);
  std::vector<Entry> entries;
  for (const auto& [name, value] : json::as_object(root, path + ": header")) {
    if (name == kMetadataKey) {
      if (metadata != nullptr) {
        metadata->clear();
        for (const auto& [k, v] : json::as_object(value, path + ": __metadata__")) {
          (*metadata)[k] = json::as_string(v, path + ": __metadata__ value of '" + k + "'");
        }
      }
      continue;
    }
    entries.push_back(parse_entry(path, name, value, data_bytes));
  }
  if (metadata != nullptr && json::find(root, kMetadataKey) == nullptr) metadata->clear();

  // Tensors must not share bytes: each would silently alias another's data.
  std::vector<const Entry*> by_offset;
  for (const auto& e : entries) by_offset.push_back(&e);
  std::stable_sort(by_offset.begin(), by_offset.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;  // empty tensors first at a tie
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i]->begin < by_offset[i - 1]->end) {
      bad_file(path, "tensors '" + by_offset[i - 1]->name + "' and '" + by_offset[i]->name + "' overlap");
    }
  }

  // In data order: the order the writer was given (the header's own order is not kept by the
  // JSON reader), and one forward pass over the file.
  NamedTensors out;
  out.reserve(entries.size());
  for (const Entry* entry : by_offset) {
    const Entry& e = *entry;
    auto t = torch::empty(e.shape, torch::TensorOptions().dtype(e.dtype));
    if (e.end > e.begin) {
      in.seekg(static_cast<std::streamoff>(data_start + e.begin), std::ios::beg);
      in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(e.end - e.begin));
      if (!in) bad_file(path, "short read of tensor '" + e.name + "'");
    }
    out.emplace_back(e.name, std::move(t));
  }
  return out;
}

void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<torch::Tensor> cpu;
  cpu.reserve(tensors.size());
  std::string header = "{";
  if (!metadata.empty()) {
    header += json::quote(kMetadataKey) + ":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      header += (first ? "" : ",") + json::quote(k) + ":" + json::quote(v);
      first = false;
    }
    header += "}";
  }
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, tensor] = tensors[i];
    if (name == kMetadataKey) throw UserError(path + ": '__metadata__' is not a valid tensor name");
    for (size_t j = 0; j < i; ++j) {
      if (tensors[j].first == name) throw UserError(path + ": tensor name '" + name + "' given twice");
    }
    const std::string dtype = safetensors_dtype_name(tensor.scalar_type());
    cpu.push_back(tensor.detach().to(torch::kCPU).contiguous());
    const uint64_t bytes = static_cast<uint64_t>(cpu.back().nbytes());
    std::string shape;
    for (int64_t d : tensor.sizes()) shape += (shape.empty() ? "" : ",") + std::to_string(d);
    if (header.size() > 1) header += ",";
    header += json::quote(name) + ":{\"dtype\":\"" + dtype + "\",\"shape\":[" + shape + "],\"data_offsets\":[" +
              std::to_string(offset) + "," + std::to_string(offset + bytes) + "]}";
    offset += bytes;
  }
  header += "}";
  // Pad so the data region starts 8-byte aligned (as the reference writer does): lets readers
  // mmap and view the tensors in place.
  header.append((8 - header.size() % 8) % 8, ' ');

  files::write_durably(path, [&](const std::string& tmp) {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw UserError(tmp + ": cannot create file");
    unsigned char len_bytes[8];
    uint64_t n = header.size();
    for (int i = 0; i < 8; ++i, n >>= 8) len_bytes[i] = static_cast<unsigned char>(n & 0xff);
    out.write(reinterpret_cast<const char*>(len_bytes), 8);
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    for (const auto& t : cpu) {
      out.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
    }
    out.close();
    if (!out) throw UserError(tmp + ": write failed (disk full?)");
  });
}

}  // namespace gpt2

// Token file writer and mmap reader (see token_file.h).
#include "data/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "data/h5_check.h"
#include "src/base/errors.h"
#include "src/base/files.h"

namespace gpt2::data {
namespace {

// ------------------------------------------------------------------------------------ writing

void write_string_attr(hid_t loc, const char* name, const std::string& value) {
  // Variable-length UTF-8 strings: what h5py writes for str, and reads back as str.
  H5Id type(H5_ID(H5Tcopy(H5T_C_S1)), H5Tclose);
  H5_CHECK(H5Tset_size(type.get(), H5T_VARIABLE));
  H5_CHECK(H5Tset_cset(type.get(), H5T_CSET_UTF8));
  H5Id space(H5_ID(H5Screate(H5S_SCALAR)), H5Sclose);
  H5Id attr(H5_ID(H5Acreate2(loc, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT)), H5Aclose);
  const char* data = value.c_str();
  H5_CHECK(H5Awrite(attr.get(), type.get(), &data));
}

void write_int_attr(hid_t loc, const char* name, int64_t value) {
  H5Id space(H5_ID(H5Screate(H5S_SCALAR)), H5Sclose);
  H5Id attr(H5_ID(H5Acreate2(loc, name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT)), H5Aclose);
  H5_CHECK(H5Awrite(attr.get(), H5T_NATIVE_INT64, &value));
}

template <typename T>
void write_dataset(hid_t file, hid_t file_type, hid_t mem_type, const std::vector<T>& data) {
  const hsize_t dims[1] = {static_cast<hsize_t>(data.size())};
  H5Id space(H5_ID(H5Screate_simple(1, dims, nullptr)), H5Sclose);
  H5Id dcpl(H5_ID(H5Pcreate(H5P_DATASET_CREATE)), H5Pclose);
  // Contiguous, allocated at creation, never filled: the reader mmaps it at H5Dget_offset, and
  // the data is written exactly once.
  H5_CHECK(H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS));
  H5_CHECK(H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY));
  H5_CHECK(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER));
  H5Id dset(H5_ID(H5Dcreate2(file, "tokens", file_type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT)),
            H5Dclose);
  if (!data.empty()) {
    H5_CHECK(H5Dwrite(dset.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()));
  }
}

// ------------------------------------------------------------------------------------ reading

std::string read_string_attr(hid_t loc, const char* name, const std::string& path) {
  H5Id attr(H5_ID(H5Aopen(loc, name, H5P_DEFAULT)), H5Aclose);
  H5Id type(H5_ID(H5Aget_type(attr.get())), H5Tclose);
  if (H5Tget_class(type.get()) != H5T_STRING) {
    throw UserError(path + ": root attribute '" + name + "' is not a string");
  }
  H5Id space(H5_ID(H5Aget_space(attr.get())), H5Sclose);
  if (H5Sget_simple_extent_npoints(space.get()) != 1) {
    throw UserError(path + ": root attribute '" + name + "' is not a single string");
  }
  const htri_t is_variable = H5_ID(H5Tis_variable_str(type.get()));
  if (is_variable > 0) {
    H5Id mem(H5_ID(H5Tcopy(H5T_C_S1)), H5Tclose);
    H5_CHECK(H5Tset_size(mem.get(), H5T_VARIABLE));
    H5_CHECK(H5Tset_cset(mem.get(), H5Tget_cset(type.get())));
    char* value = nullptr;
    H5_CHECK(H5Aread(attr.get(), mem.get(), &value));
    std::string out = value != nullptr ? value : "";
    H5free_memory(value);
    return out;
  }
  // Fixed-length (what h5py writes for numpy bytes): may or may not be NUL-terminated.
  const size_t size = H5Tget_size(type.get());
  std::string buf(size, '\0');
  H5_CHECK(H5Aread(attr.get(), type.get(), buf.data()));
  buf.resize(std::strlen(buf.c_str()));
  return buf;
}

int64_t read_int_attr(hid_t loc, const char* name, const std::string& path) {
  H5Id attr(H5_ID(H5Aopen(loc, name, H5P_DEFAULT)), H5Aclose);
  H5Id type(H5_ID(H5Aget_type(attr.get())), H5Tclose);
  H5Id space(H5_ID(H5Aget_space(attr.get())), H5Sclose);
  if (H5Tget_class(type.get()) != H5T_INTEGER || H5Sget_simple_extent_npoints(space.get()) != 1) {
    throw UserError(path + ": root attribute '" + name + "' is not a single integer");
  }
  int64_t value = 0;
  H5_CHECK(H5Aread(attr.get(), H5T_NATIVE_INT64, &value));
  return value;
}

void require_attr(hid_t file, const char* name, const std::string& path) {
  const htri_t exists = H5_ID(H5Aexists(file, name));
  if (exists == 0) {
    throw UserError(path + ": missing root attribute '" + name + "' (not a " + kTokenFileFormat +
                    " file? write one with gpt2-data)");
  }
}

std::string describe_type(hid_t type) {
  const H5T_class_t cls = H5Tget_class(type);
  const size_t bits = H5Tget_size(type) * 8;
  switch (cls) {
    case H5T_INTEGER:
      return std::string(H5Tget_sign(type) == H5T_SGN_NONE ? "uint" : "int") + std::to_string(bits) +
             (H5Tget_order(type) == H5T_ORDER_BE ? " (big-endian)" : "");
    case H5T_FLOAT: return "float" + std::to_string(bits);
    case H5T_STRING: return "string";
    default: return "a non-numeric type";
  }
}

// Validates the HDF5 structure and fills `info`; returns the byte offset of the token data.
uint64_t inspect(const std::string& path, int64_t expected_vocab, TokenFileInfo* info) {
  H5ErrorSilencer quiet;
#if H5_VERSION_GE(1, 12, 0)
  const htri_t is_h5 = H5Fis_accessible(path.c_str(), H5P_DEFAULT);
#else
  const htri_t is_h5 = H5Fis_hdf5(path.c_str());
#endif
  if (is_h5 <= 0) throw UserError(path + ": not an HDF5 file (expected a token file from gpt2-data)");
  const hid_t file_id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file_id < 0) {
    const std::string detail = h5_error_detail();
    throw UserError(path + ": cannot open as HDF5, the file is damaged or truncated" +
                    (detail.empty() ? std::string() : " (" + detail + ")"));
  }
  H5Id file(file_id, H5Fclose);

  require_attr(file.get(), "format", path);
  const std::string format = read_string_attr(file.get(), "format", path);
  if (format != kTokenFileFormat) {
    throw UserError(path + ": root attribute format is '" + format + "', expected '" +
                    kTokenFileFormat + "'");
  }
  for (const char* name : {"format_version", "vocab_size", "eot_token", "tokenizer"}) {
    require_attr(file.get(), name, path);
  }
  info->format_version = read_int_attr(file.get(), "format_version", path);
  if (info->format_version != kTokenFileVersion) {
    throw UserError(path + ": format_version " + std::to_string(info->format_version) +
                    " is not supported (this build reads version " + std::to_string(kTokenFileVersion) +
                    "; regenerate the file with this gpt2-data)");
  }
  info->vocab_size = read_int_attr(file.get(), "vocab_size", path);
  info->eot_token = read_int_attr(file.get(), "eot_token", path);
  info->tokenizer = read_string_attr(file.get(), "tokenizer", path);
  if (info->vocab_size <= 0 || info->vocab_size > (int64_t{1} << 32)) {
    throw UserError(path + ": vocab_size " + std::to_string(info->vocab_size) + " is out of range");
  }
  if (info->eot_token < 0 || info->eot_token >= info->vocab_size) {
    throw UserError(path + ": eot_token " + std::to_string(info->eot_token) + " is not below vocab_size " +
                    std::to_string(info->vocab_size));
  }
  if (expected_vocab >= 0 && info->vocab_size > expected_vocab) {
    throw UserError(path + ": vocab_size " + std::to_string(info->vocab_size) +
                    " is larger than the model's vocab_size " + std::to_string(expected_vocab) +
                    " (was the file made with another tokenizer?)");
  }

  const htri_t has_tokens = H5_ID(H5Lexists(file.get(), "tokens", H5P_DEFAULT));
  if (has_tokens == 0) throw UserError(path + ": no dataset /tokens");
  H5Id object(H5_ID(H5Oopen(file.get(), "tokens", H5P_DEFAULT)), H5Oclose);
  if (H5Iget_type(object.get()) != H5I_DATASET) throw UserError(path + ": /tokens is not a dataset");
  object.reset();
  H5Id dset(H5_ID(H5Dopen2(file.get(), "tokens", H5P_DEFAULT)), H5Dclose);

  H5Id type(H5_ID(H5Dget_type(dset.get())), H5Tclose);
  const size_t type_size = H5Tget_size(type.get());
  // Native order: the reader copies bytes straight from the mapping (x86 and ARM are little-endian).
  const bool ok_type = H5Tget_class(type.get()) == H5T_INTEGER && H5Tget_sign(type.get()) == H5T_SGN_NONE &&
                       (type_size == 2 || type_size == 4) && H5Tget_order(type.get()) == H5T_ORDER_LE;
  if (!ok_type) {
    throw UserError(path + ": /tokens has type " + describe_type(type.get()) +
                    ", expected little-endian uint16 or uint32");
  }
  info->dtype_bytes = static_cast<int>(type_size);
  if (type_size == 2 && info->vocab_size > 65536) {
    throw UserError(path + ": /tokens is uint16 but vocab_size " + std::to_string(info->vocab_size) +
                    " needs uint32");
  }

  H5Id space(H5_ID(H5Dget_space(dset.get())), H5Sclose);
  if (H5Sget_simple_extent_ndims(space.get()) != 1) {
    throw UserError(path + ": /tokens has rank " + std::to_string(H5Sget_simple_extent_ndims(space.get())) +
                    ", expected a 1-D dataset");
  }
  hsize_t dims[1] = {0};
  H5_CHECK(H5Sget_simple_extent_dims(space.get(), dims, nullptr));
  info->num_tokens = static_cast<int64_t>(dims[0]);

  H5Id dcpl(H5_ID(H5Dget_create_plist(dset.get())), H5Pclose);
  const H5D_layout_t layout = H5Pget_layout(dcpl.get());
  if (layout != H5D_CONTIGUOUS) {
    const char* name = layout == H5D_CHUNKED ? "chunked" : layout == H5D_COMPACT ? "compact" : "virtual";
    throw UserError(path + ": /tokens is " + name +
                    ", expected contiguous storage so it can be memory-mapped (regenerate it with gpt2-data)");
  }
  if (H5Pget_nfilters(dcpl.get()) != 0) {
    throw UserError(path + ": /tokens has filters (compression), expected none");
  }
  if (H5Pget_external_count(dcpl.get()) != 0) {
    throw UserError(path + ": /tokens is stored in external files, expected inside the file");
  }
  if (info->num_tokens == 0) return 0;
  const haddr_t offset = H5Dget_offset(dset.get());
  if (offset == HADDR_UNDEF) throw UserError(path + ": /tokens has no storage allocated");
  return static_cast<uint64_t>(offset);
}

inline int64_t load_token(const unsigned char* p, int dtype_bytes) {
  // memcpy: the data may sit at any byte offset, and this compiles to a plain load.
  if (dtype_bytes == 2) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
  }
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

}  // namespace

void write_token_file(const std::string& path, const std::vector<uint32_t>& tokens,
                      const TokenFileAttrs& attrs) {
  if (attrs.vocab_size <= 0 || attrs.vocab_size > (int64_t{1} << 32)) {
    throw UserError(path + ": vocab_size " + std::to_string(attrs.vocab_size) + " is out of range");
  }
  if (attrs.eot_token < 0 || attrs.eot_token >= attrs.vocab_size) {
    throw UserError(path + ": eot_token " + std::to_string(attrs.eot_token) + " is not below vocab_size");
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (static_cast<int64_t>(tokens[i]) >= attrs.vocab_size) {
      throw UserError(path + ": token " + std::to_string(tokens[i]) + " at position " + std::to_string(i) +
                      " is not below vocab_size " + std::to_string(attrs.vocab_size));
    }
  }
  const std::string tmp = path + ".tmp";
  try {
    H5ErrorSilencer quiet;
    const hid_t file_id = H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (file_id < 0) {
      throw UserError("cannot create " + tmp + " (does the directory exist and is it writable?)");
    }
    H5Id file(file_id, H5Fclose);
    write_string_attr(file.get(), "format", kTokenFileFormat);
    write_int_attr(file.get(), "format_version", kTokenFileVersion);
    write_int_attr(file.get(), "vocab_size", attrs.vocab_size);
    write_int_attr(file.get(), "eot_token", attrs.eot_token);
    write_string_attr(file.get(), "tokenizer", attrs.tokenizer);
    if (attrs.vocab_size <= 65536) {
      const std::vector<uint16_t> narrow(tokens.begin(), tokens.end());
      write_dataset(file.get(), H5T_STD_U16LE, H5T_NATIVE_UINT16, narrow);
    } else {
      write_dataset(file.get(), H5T_STD_U32LE, H5T_NATIVE_UINT32, tokens);
    }
    // Close explicitly: this is where HDF5 flushes, so a full disk shows up here.
    if (H5Fclose(file.release()) < 0) {
      const std::string detail = h5_error_detail();
      throw UserError("cannot finish writing " + tmp + (detail.empty() ? "" : ": " + detail));
    }
  } catch (const Error& e) {
    std::remove(tmp.c_str());
    if (dynamic_cast<const UserError*>(&e) != nullptr) throw;
    throw UserError(path + ": writing failed: " + e.what());
  }
  try {
    files::rename_file(tmp, path);
  } catch (const UserError&) {
    std::remove(tmp.c_str());
    throw;
  }
}

TokenFile TokenFile::open(const std::string& path, int64_t expected_vocab) {
  TokenFile tf;
  tf.info_.path = path;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw UserError(path + ": cannot open token file: " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) throw UserError(path + ": not a regular file");
  if (::access(path.c_str(), R_OK) != 0) {
    throw UserError(path + ": cannot read token file: " + std::strerror(errno));
  }
  uint64_t offset = 0;
  try {
    offset = inspect(path, expected_vocab, &tf.info_);
  } catch (const UserError&) {
    throw;
  } catch (const Error& e) {
    throw UserError(path + ": not a readable token file: " + e.what());
  }
  if (tf.info_.num_tokens == 0) return tf;

  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw UserError(path + ": cannot open token file: " + std::strerror(errno));
  struct stat fst {};
  if (::fstat(fd, &fst) != 0) {
    const std::string reason = std::strerror(errno);
    ::close(fd);
    throw UserError(path + ": cannot stat token file: " + reason);
  }
  const auto file_size = static_cast<uint64_t>(fst.st_size);
  const uint64_t need = offset + static_cast<uint64_t>(tf.info_.num_tokens) * tf.info_.dtype_bytes;
  if (need > file_size) {
    ::close(fd);
    throw UserError(path + ": truncated: /tokens needs " + std::to_string(need) + " bytes but the file has " +
                    std::to_string(file_size));
  }
  void* base = ::mmap(nullptr, file_size, PROT_READ, MAP_SHARED, fd, 0);
  const int mmap_errno = errno;
  ::close(fd);  // the mapping keeps the file open
  if (base == MAP_FAILED) {
    throw UserError(path + ": cannot mmap token file: " + std::strerror(mmap_errno));
  }
  tf.map_base_ = base;
  tf.map_length_ = file_size;
  tf.data_ = static_cast<const unsigned char*>(base) + offset;
  return tf;
}

TokenFile::TokenFile(TokenFile&& other) noexcept
    : info_(std::move(other.info_)),
      map_base_(std::exchange(other.map_base_, nullptr)),
      map_length_(std::exchange(other.map_length_, 0)),
      data_(std::exchange(other.data_, nullptr)) {}

TokenFile& TokenFile::operator=(TokenFile&& other) noexcept {
  if (this != &other) {
    unmap();
    info_ = std::move(other.info_);
    map_base_ = std::exchange(other.map_base_, nullptr);
    map_length_ = std::exchange(other.map_length_, 0);
    data_ = std::exchange(other.data_, nullptr);
  }
  return *this;
}

TokenFile::~TokenFile() { unmap(); }

void TokenFile::unmap() {
  if (map_base_ != nullptr) ::munmap(map_base_, map_length_);
  map_base_ = nullptr;
  map_length_ = 0;
  data_ = nullptr;
}

void TokenFile::read(int64_t start, int64_t n, int64_t* out) const {
  if (start < 0 || n < 0 || start > info_.num_tokens || n > info_.num_tokens - start) {
    throw UserError(info_.path + ": read of tokens [" + std::to_string(start) + ", " +
                    std::to_string(start) + "+" + std::to_string(n) + ") is outside [0, " +
                    std::to_string(info_.num_tokens) + ")");
  }
  const int bytes = info_.dtype_bytes;
  const unsigned char* p = data_ + start * bytes;
  if (bytes == 2) {
    for (int64_t i = 0; i < n; ++i) out[i] = load_token(p + 2 * i, 2);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = load_token(p + 4 * i, 4);
  }
}

void TokenFile::validate_ids() const {
  const int bytes = info_.dtype_bytes;
  const int64_t vocab = info_.vocab_size;
  // Blocked scan: a branch-free max per block, and the exact position only for a bad block.
  constexpr int64_t kBlock = 4096;
  for (int64_t start = 0; start < info_.num_tokens; start += kBlock) {
    const int64_t end = std::min(info_.num_tokens, start + kBlock);
    int64_t max_id = 0;
    for (int64_t i = start; i < end; ++i) max_id = std::max(max_id, load_token(data_ + i * bytes, bytes));
    if (max_id < vocab) continue;
    for (int64_t i = start; i < end; ++i) {
      const int64_t id = load_token(data_ + i * bytes, bytes);
      if (id >= vocab) {
        throw UserError(info_.path + ": token at position " + std::to_string(i) + " is " + std::to_string(id) +
                        ", not below vocab_size " + std::to_string(vocab) + " (corrupt or made with another tokenizer)");
      }
    }
  }
}

}  // namespace gpt2::data

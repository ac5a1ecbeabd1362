// Token file writer and mmap reader (see token_file.h).
#include "data/token_file.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <utility>

#include "src/base/errors.h"
#include "src/base/files.h"
#include "src/base/h5_check.h"

namespace gpt2::data {
namespace {

using h5::h5_error_detail;
using h5::H5ErrorSilencer;
using h5::H5Id;
using h5::read_int_attr;
using h5::write_int_attr;
using h5::write_string_attr;

// ------------------------------------------------------------------------------------ writing

void write_dataset(hid_t file, hid_t file_type, hid_t mem_type, const void* data, size_t n) {
  const hsize_t dims[1] = {static_cast<hsize_t>(n)};
  H5Id space(H5_ID(H5Screate_simple(1, dims, nullptr)), H5Sclose);
  H5Id dcpl(H5_ID(H5Pcreate(H5P_DATASET_CREATE)), H5Pclose);
  // Contiguous, allocated at creation, never filled: the reader mmaps it at H5Dget_offset, and
  // the data is written exactly once.
  H5_CHECK(H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS));
  H5_CHECK(H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY));
  H5_CHECK(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER));
  H5Id dset(H5_ID(H5Dcreate2(file, "tokens", file_type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT)), H5Dclose);
  if (n > 0) H5_CHECK(H5Dwrite(dset.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data));
}

// ------------------------------------------------------------------------------------ reading

constexpr size_t kMaxStringAttrBytes = 4096;

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
  // A damaged type can claim any size; our strings are short names.
  if (size == 0 || size > kMaxStringAttrBytes) {
    throw UserError(path + ": root attribute '" + name + "' has an implausible string size " + std::to_string(size));
  }
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
    case H5T_INTEGER: {
      const size_t precision = H5Tget_precision(type);
      return std::string(H5Tget_sign(type) == H5T_SGN_NONE ? "uint" : "int") + std::to_string(bits) +
             (H5Tget_order(type) == H5T_ORDER_BE ? " (big-endian)" : "") +
             (precision != bits || H5Tget_offset(type) != 0
                  ? " (" + std::to_string(precision) + " significant bits at offset " +
                        std::to_string(H5Tget_offset(type)) + ")"
                  : std::string());
    }
    case H5T_FLOAT:
      return "float" + std::to_string(bits);
    case H5T_STRING:
      return "string";
    default:
      return "a non-numeric type";
  }
}

// Note [libhdf5 global heap loop]
// libhdf5 up to at least 1.10.8 (Debian 12's) loops forever parsing a global heap collection
// ("GCOL", where variable-length strings such as our `format` and `tokenizer` attributes live)
// whose free-space object has size 0: its decoder advances by the object's size. Found by
// tests/fuzz (fuzz_token_file); later HDF5 releases reject such heaps. So before any
// variable-length string is read, every collection in the file's metadata (everything but the
// token data, which may hold any bytes) is walked the way libhdf5 walks it, and a walk that would
// not advance, or would jump out of its collection, is refused.
struct ByteRange {
  uint64_t begin = 0;
  uint64_t end = 0;  // exclusive; empty: nothing excluded
};

void check_global_heaps(int fd, uint64_t file_size, ByteRange token_data, const std::string& path) {
  constexpr uint64_t kBlock = uint64_t{1} << 20;
  constexpr size_t kHeader = 16;  // "GCOL", version, 3 reserved, collection size (8, "length" size)
  std::string block;
  auto read_at = [&](uint64_t at, uint64_t n, std::string* out) {
    out->resize(static_cast<size_t>(n));
    const ssize_t got = ::pread(fd, out->data(), out->size(), static_cast<off_t>(at));
    out->resize(got > 0 ? static_cast<size_t>(got) : 0);
  };
  auto check_collection = [&](uint64_t at) {
    std::string head;
    read_at(at, kHeader, &head);
    if (head.size() < kHeader || head[4] != 1) return;  // libhdf5 refuses these itself
    uint64_t size = 0;
    std::memcpy(&size, head.data() + 8, 8);
    if (size < kHeader || size > file_size - at) return;  // likewise ("addr overflow")
    std::string heap;
    read_at(at, size, &heap);
    if (heap.size() != size) return;
    const auto* base = reinterpret_cast<const unsigned char*>(heap.data());
    uint64_t p = kHeader;
    while (p < size) {
      if (p + 16 > size) break;  // a tail too small for an object header: free space
      uint16_t index = 0;
      uint64_t object_size = 0;
      std::memcpy(&index, base + p, 2);
      std::memcpy(&object_size, base + p + 8, 8);
      // libhdf5: need = 16 + align8(size) for objects, size itself for the free space (index 0).
      const uint64_t need =
          index > 0 ? (object_size > size ? 0 : 16 + ((object_size + 7) & ~uint64_t{7})) : object_size;
      if (need == 0 || need > size - p) {
        throw UserError(path + ": damaged HDF5 global heap at byte " + std::to_string(at) + " (object " +
                        std::to_string(index) + " of size " + std::to_string(object_size) +
                        "); refusing it before libhdf5 parses it (it can hang on such heaps)");
      }
      p += need;
    }
  };
  auto scan = [&](uint64_t begin, uint64_t end) {
    for (uint64_t at = begin; at < end; at += kBlock) {
      // Overlap blocks by 3 bytes so a signature across a boundary is seen.
      read_at(at, std::min(kBlock + 3, end - at), &block);
      for (size_t i = block.find("GCOL"); i != std::string::npos; i = block.find("GCOL", i + 1)) {
        if (i >= kBlock) break;  // belongs to the next block
        check_collection(at + i);
      }
    }
  };
  scan(0, std::min(token_data.begin, file_size));
  if (token_data.end > token_data.begin) scan(std::min(token_data.end, file_size), file_size);
}

// Where /tokens's data lies, when it is an allocated contiguous dataset; an empty range otherwise
// (then the whole file is scanned, and inspect() refuses the file later anyway).
ByteRange locate_token_data(hid_t file, uint64_t file_size) {
  ByteRange none{file_size, file_size};
  if (H5Lexists(file, "tokens", H5P_DEFAULT) <= 0) return none;
  H5L_info_t link{};
  if (H5Lget_info(file, "tokens", &link, H5P_DEFAULT) < 0 || link.type != H5L_TYPE_HARD) return none;
  const hid_t object_id = H5Oopen(file, "tokens", H5P_DEFAULT);
  if (object_id < 0) return none;
  H5Id object(object_id, H5Oclose);
  if (H5Iget_type(object.get()) != H5I_DATASET) return none;
  const hid_t dset_id = H5Dopen2(file, "tokens", H5P_DEFAULT);
  if (dset_id < 0) return none;
  H5Id dset(dset_id, H5Dclose);
  const haddr_t offset = H5Dget_offset(dset.get());
  const hsize_t bytes = H5Dget_storage_size(dset.get());
  if (offset == HADDR_UNDEF || offset >= file_size || bytes == 0) return none;
  return ByteRange{offset, offset + std::min<uint64_t>(bytes, file_size - offset)};
}

// Validates the HDF5 structure and fills `info`; returns the byte offset of the token data.
uint64_t inspect(const std::string& path, int fd, int64_t expected_vocab, uint64_t file_size, TokenFileInfo* info) {
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
  {
    // Before the first variable-length string read (Note [libhdf5 global heap loop]).
    H5ErrorSilencer quiet_probe;
    const ByteRange token_data = locate_token_data(file.get(), file_size);
    H5Eclear2(H5E_DEFAULT);
    check_global_heaps(fd, file_size, token_data, path);
  }

  require_attr(file.get(), "format", path);
  const std::string format = read_string_attr(file.get(), "format", path);
  if (format != kTokenFileFormat) {
    throw UserError(path + ": root attribute format is '" + format + "', expected '" + kTokenFileFormat + "'");
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
  // An external link would make H5Dget_offset an offset into another file than the one we mmap.
  // (A soft link stays inside this file, so it is fine.)
  H5L_info_t link{};
  H5_CHECK(H5Lget_info(file.get(), "tokens", &link, H5P_DEFAULT));
  if (link.type != H5L_TYPE_HARD && link.type != H5L_TYPE_SOFT) {
    throw UserError(path + ": /tokens is an external link, expected a dataset in this file");
  }
  H5Id object(H5_ID(H5Oopen(file.get(), "tokens", H5P_DEFAULT)), H5Oclose);
  if (H5Iget_type(object.get()) != H5I_DATASET) throw UserError(path + ": /tokens is not a dataset");
  object.reset();
  H5Id dset(H5_ID(H5Dopen2(file.get(), "tokens", H5P_DEFAULT)), H5Dclose);

  H5Id type(H5_ID(H5Dget_type(dset.get())), H5Tclose);
  const size_t type_size = H5Tget_size(type.get());
  // Native order: the reader copies bytes straight from the mapping (x86 and ARM are little-endian).
  // Precision and offset too: a 12-bit integer stored in 2 bytes would read as garbage from the map.
  const bool ok_type = H5Tget_class(type.get()) == H5T_INTEGER && H5Tget_sign(type.get()) == H5T_SGN_NONE &&
                       (type_size == 2 || type_size == 4) && H5Tget_order(type.get()) == H5T_ORDER_LE &&
                       H5Tget_precision(type.get()) == 8 * type_size && H5Tget_offset(type.get()) == 0;
  if (!ok_type) {
    throw UserError(path + ": /tokens has type " + describe_type(type.get()) +
                    ", expected little-endian uint16 or uint32");
  }
  info->dtype_bytes = static_cast<int>(type_size);
  if (type_size == 2 && info->vocab_size > 65536) {
    throw UserError(path + ": /tokens is uint16 but vocab_size " + std::to_string(info->vocab_size) + " needs uint32");
  }

  H5Id space(H5_ID(H5Dget_space(dset.get())), H5Sclose);
  if (H5Sget_simple_extent_ndims(space.get()) != 1) {
    throw UserError(path + ": /tokens has rank " + std::to_string(H5Sget_simple_extent_ndims(space.get())) +
                    ", expected a 1-D dataset");
  }
  hsize_t dims[1] = {0};
  H5_CHECK(H5Sget_simple_extent_dims(space.get(), dims, nullptr));
  // Bounded by the file itself: the tokens must fit in it (checked exactly once the offset is known).
  if (dims[0] > static_cast<hsize_t>(file_size) / type_size) {
    throw UserError(path + ": /tokens claims " + std::to_string(dims[0]) + " tokens, more than the file's " +
                    std::to_string(file_size) + " bytes can hold (truncated or damaged)");
  }
  info->num_tokens = static_cast<int64_t>(dims[0]);

  H5Id dcpl(H5_ID(H5Dget_create_plist(dset.get())), H5Pclose);
  const H5D_layout_t layout = H5Pget_layout(dcpl.get());
  if (layout != H5D_CONTIGUOUS) {
    const char* name = layout == H5D_CHUNKED   ? "chunked"
                       : layout == H5D_COMPACT ? "compact"
                       : layout == H5D_VIRTUAL ? "virtual"
                                               : "of an unknown layout";
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
  const uint64_t need = static_cast<uint64_t>(info->num_tokens) * type_size;  // <= file_size: no overflow
  if (offset > file_size || need > file_size - offset) {
    throw UserError(path + ": truncated: /tokens needs bytes [" + std::to_string(offset) + ", " +
                    std::to_string(offset) + "+" + std::to_string(need) + ") but the file has " +
                    std::to_string(file_size));
  }
  return static_cast<uint64_t>(offset);
}

// Note [libhdf5 in a child process]
// libhdf5 1.10.8 (Debian 12's) can crash on a damaged file: tests/fuzz found SIGFPE in
// H5D__chunk_set_info and SIGSEGV in H5HG_read and in attribute decoding, none fixable from our
// side of the API. A crash would take the training job (and every MPI rank with it) down without
// saying which file was bad. So the HDF5 part of opening runs in a forked child that reports the
// offset and attributes through a pipe and exits; the parent never parses the file with libhdf5,
// turns a child's death or silence into a UserError naming the file, and then mmaps the data
// itself. The child only runs inspect() and _exit()s: no MPI, CUDA, logging or atexit handlers.
// Cost: one fork per opened shard (about a millisecond). If fork itself fails (no memory for the
// page tables, a process limit), inspect() runs in this process as before.
constexpr int kInspectTimeoutSeconds = 120;  // metadata only; a healthy file takes milliseconds

// The child's report: a tag byte, then either the fields of TokenFileInfo or an error message.
enum class Report : char { kOk = 'o', kUserError = 'u', kError = 'e' };

void put_u64(std::string* out, uint64_t v) { out->append(reinterpret_cast<const char*>(&v), 8); }
void put_str(std::string* out, const std::string& s) {
  put_u64(out, s.size());
  out->append(s);
}

struct ReportReader {
  const std::string& in;
  size_t at = 1;
  bool ok = true;
  uint64_t u64() {
    uint64_t v = 0;
    if (in.size() - at < 8) {
      ok = false;
      return 0;
    }
    std::memcpy(&v, in.data() + at, 8);
    at += 8;
    return v;
  }
  std::string str() {
    const uint64_t n = u64();
    if (!ok || in.size() - at < n) {
      ok = false;
      return {};
    }
    std::string s = in.substr(at, n);
    at += n;
    return s;
  }
};

std::string signal_name(int sig) {
  const char* name = ::strsignal(sig);
  return "signal " + std::to_string(sig) + (name != nullptr ? std::string(" (") + name + ")" : std::string());
}

void write_all(int fd, const std::string& data) {
  for (size_t done = 0; done < data.size();) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

[[noreturn]] void inspect_in_child(int out_fd, const std::string& path, int fd, int64_t expected_vocab,
                                   uint64_t file_size) {
  std::string report;
  try {
    TokenFileInfo info;
    const uint64_t offset = inspect(path, fd, expected_vocab, file_size, &info);
    report.push_back(static_cast<char>(Report::kOk));
    put_u64(&report, offset);
    for (int64_t v :
         {info.num_tokens, info.vocab_size, info.eot_token, int64_t{info.dtype_bytes}, info.format_version}) {
      put_u64(&report, static_cast<uint64_t>(v));
    }
    put_str(&report, info.tokenizer);
  } catch (const UserError& e) {
    report.assign(1, static_cast<char>(Report::kUserError));
    put_str(&report, e.what());
  } catch (const std::exception& e) {
    report.assign(1, static_cast<char>(Report::kError));
    put_str(&report, e.what());
  }
  write_all(out_fd, report);
  ::_exit(0);
}

// inspect() in a child process (Note [libhdf5 in a child process]); same contract.
uint64_t inspect_isolated(const std::string& path, int fd, int64_t expected_vocab, uint64_t file_size,
                          TokenFileInfo* info) {
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return inspect(path, fd, expected_vocab, file_size, info);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(pipe_fds[0]);
    ::close(pipe_fds[1]);
    return inspect(path, fd, expected_vocab, file_size, info);
  }
  if (pid == 0) {
    ::close(pipe_fds[0]);
    inspect_in_child(pipe_fds[1], path, fd, expected_vocab, file_size);
  }
  ::close(pipe_fds[1]);
  std::string report;
  bool timed_out = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kInspectTimeoutSeconds);
  for (char buf[4096];;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{pipe_fds[0], POLLIN, 0};
    const int ready = left.count() > 0 ? ::poll(&p, 1, static_cast<int>(left.count())) : 0;
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) {
      timed_out = ready == 0;
      break;
    }
    const ssize_t n = ::read(pipe_fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EOF: the child exited (or died)
    report.append(buf, static_cast<size_t>(n));
  }
  ::close(pipe_fds[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    throw UserError(path + ": libhdf5 did not finish reading the file's metadata in " +
                    std::to_string(kInspectTimeoutSeconds) + " s; the file is damaged (regenerate it with gpt2-data)");
  }
  if (WIFSIGNALED(status)) {
    throw UserError(path + ": libhdf5 crashed reading this file (" + signal_name(WTERMSIG(status)) +
                    "); the file is damaged (regenerate it with gpt2-data)");
  }
  ReportReader in{report};
  const char tag = report.empty() ? '\0' : report[0];
  if (tag == static_cast<char>(Report::kOk)) {
    const uint64_t offset = in.u64();
    info->num_tokens = static_cast<int64_t>(in.u64());
    info->vocab_size = static_cast<int64_t>(in.u64());
    info->eot_token = static_cast<int64_t>(in.u64());
    info->dtype_bytes = static_cast<int>(in.u64());
    info->format_version = static_cast<int64_t>(in.u64());
    info->tokenizer = in.str();
    if (in.ok) return offset;
  } else if (tag == static_cast<char>(Report::kUserError) || tag == static_cast<char>(Report::kError)) {
    const std::string message = in.str();
    if (in.ok && tag == static_cast<char>(Report::kUserError)) throw UserError(message);
    if (in.ok) throw Error(message);
  }
  throw UserError(path + ": the process reading the file's HDF5 metadata ended without a result (exit status " +
                  std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) + ")");
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

namespace {

template <typename T>
void write_tokens(const std::string& path, const T* tokens, size_t n, const TokenFileAttrs& attrs, hid_t mem_type) {
  if (attrs.vocab_size <= 0 || attrs.vocab_size > (int64_t{1} << 32)) {
    throw UserError(path + ": vocab_size " + std::to_string(attrs.vocab_size) + " is out of range");
  }
  if (attrs.eot_token < 0 || attrs.eot_token >= attrs.vocab_size) {
    throw UserError(path + ": eot_token " + std::to_string(attrs.eot_token) + " is not below vocab_size");
  }
  T max_id = 0;
  for (size_t i = 0; i < n; ++i) max_id = std::max(max_id, tokens[i]);
  if (n > 0 && static_cast<int64_t>(max_id) >= attrs.vocab_size) {
    for (size_t i = 0; i < n; ++i) {
      if (static_cast<int64_t>(tokens[i]) >= attrs.vocab_size) {
        throw UserError(path + ": token " + std::to_string(tokens[i]) + " at position " + std::to_string(i) +
                        " is not below vocab_size " + std::to_string(attrs.vocab_size));
      }
    }
  }
  // Durable (files.h Note [Durable write]): PATH.tmp, fsync, rename, fsync of the directory.
  files::write_durably(path, [&](const std::string& tmp) {
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
      write_dataset(file.get(), attrs.vocab_size <= 65536 ? H5T_STD_U16LE : H5T_STD_U32LE, mem_type, tokens, n);
      // Close explicitly: this is where HDF5 flushes, so a full disk shows up here.
      if (H5Fclose(file.release()) < 0) {
        const std::string detail = h5_error_detail();
        throw UserError("cannot finish writing " + tmp + (detail.empty() ? "" : ": " + detail));
      }
    } catch (const Error& e) {
      if (dynamic_cast<const UserError*>(&e) != nullptr) throw;
      throw UserError(path + ": writing failed: " + e.what());
    }
  });
}

}  // namespace

void write_token_file(const std::string& path, const std::vector<uint32_t>& tokens, const TokenFileAttrs& attrs) {
  write_tokens(path, tokens.data(), tokens.size(), attrs, H5T_NATIVE_UINT32);
}

void write_token_file(const std::string& path, const uint16_t* tokens, size_t n, const TokenFileAttrs& attrs) {
  write_tokens(path, tokens, n, attrs, H5T_NATIVE_UINT16);
}

void write_token_file(const std::string& path, const uint32_t* tokens, size_t n, const TokenFileAttrs& attrs) {
  write_tokens(path, tokens, n, attrs, H5T_NATIVE_UINT32);
}

namespace {

// The HDF5 signature sits at offset 0, or after a user block at 512, 1024, 2048, ... bytes.
// Checking it first keeps text files, .bin shards and empty files away from libhdf5's parser.
bool has_hdf5_signature(int fd, uint64_t file_size) {
  static constexpr unsigned char kSignature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  for (uint64_t at = 0; at + sizeof kSignature <= file_size; at = at == 0 ? 512 : 2 * at) {
    unsigned char buf[sizeof kSignature];
    if (::pread(fd, buf, sizeof buf, static_cast<off_t>(at)) != static_cast<ssize_t>(sizeof buf)) return false;
    if (std::memcmp(buf, kSignature, sizeof buf) == 0) return true;
  }
  return false;
}

}  // namespace

TokenFile TokenFile::open(const std::string& path, int64_t expected_vocab) {
  TokenFile tf;
  tf.info_.path = path;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    throw UserError(
        path + ": cannot open token file: " + std::strerror(err) +
        (path.empty() || path[0] == '/' ? "" : " (relative to the working directory " + files::current_dir() + ")"));
  }
  if (S_ISDIR(st.st_mode)) throw UserError(path + ": not a regular file (a directory; name a token file in it)");
  if (!S_ISREG(st.st_mode)) throw UserError(path + ": not a regular file");
  struct Descriptor {  // closes on every way out; the mapping keeps the file open after
    int fd;
    ~Descriptor() {
      if (fd >= 0) ::close(fd);
    }
  } file{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (file.fd < 0) throw UserError(path + ": cannot read token file: " + std::strerror(errno));
  struct stat fst {};
  if (::fstat(file.fd, &fst) != 0) throw UserError(path + ": cannot stat token file: " + std::strerror(errno));
  const auto file_size = static_cast<uint64_t>(fst.st_size);
  if (file_size == 0) {
    throw UserError(path + ": empty file (0 bytes), not a token file (was gpt2-data interrupted?)");
  }
  if (!has_hdf5_signature(file.fd, file_size)) {
    throw UserError(path + ": not an HDF5 file (expected a token file from gpt2-data)");
  }
  uint64_t offset = 0;
  try {
    offset = inspect_isolated(path, file.fd, expected_vocab, file_size, &tf.info_);
  } catch (const UserError&) {
    throw;
  } catch (const Error& e) {
    throw UserError(path + ": not a readable token file: " + e.what());
  }
  struct stat now {};
  if (::stat(path.c_str(), &now) != 0 || now.st_ino != fst.st_ino || now.st_dev != fst.st_dev ||
      now.st_size != fst.st_size) {
    throw UserError(path + ": the file changed while it was being opened (is gpt2-data still writing it?)");
  }
  if (tf.info_.num_tokens == 0) return tf;
  // The same descriptor as the checks above: the mapping is of the file that was validated, even
  // if the path is replaced meanwhile (gpt2-data's tmp + rename).
  void* base = ::mmap(nullptr, file_size, PROT_READ, MAP_SHARED, file.fd, 0);
  if (base == MAP_FAILED) throw UserError(path + ": cannot mmap token file: " + std::strerror(errno));
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
    throw UserError(info_.path + ": read of tokens [" + std::to_string(start) + ", " + std::to_string(start) + "+" +
                    std::to_string(n) + ") is outside [0, " + std::to_string(info_.num_tokens) + ")");
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
                        ", not below vocab_size " + std::to_string(vocab) +
                        " (corrupt or made with another tokenizer)");
      }
    }
  }
}

}  // namespace gpt2::data

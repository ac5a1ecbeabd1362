#pragma once
// HDF5 helpers: the H5_CHECK macro, an RAII owner for hid_t, and a guard that stops HDF5 from
// printing its error stack so our own message (which quotes the innermost HDF5 error) is the one
// the user sees. Uses the HDF5 C API only (1.10 and later).
// defines: H5_CHECK, H5_ID, gpt2::h5::H5Id, H5ErrorSilencer, h5_error_detail, open_h5, has_link,
// dataset_dims, read_int_attr, write_int_attr, write_string_attr
#include <hdf5.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "src/base/errors.h"

namespace gpt2::h5 {

// The most specific message on HDF5's current error stack ("" when it is empty), e.g.
// "truncated file: eof = 800, sb_eof = 4144". Why: HDF5's own messages say what is damaged.
inline std::string h5_error_detail() {
  std::string detail;
  auto visit = [](unsigned n, const H5E_error2_t* err, void* data) -> herr_t {
    auto* out = static_cast<std::string*>(data);
    if (n == 0 && err != nullptr && err->desc != nullptr) *out = err->desc;
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, visit, &detail);
  return detail;
}

[[noreturn]] inline void h5_throw(const char* call, const char* file, int line) {
  const std::string detail = h5_error_detail();
  ::gpt2::throw_call_error(call, detail.empty() ? "negative result" : detail, file, line);
}

// Calls `call` (a herr_t/htri_t/hid_t expression) and throws gpt2::Error naming it when negative.
#define H5_CHECK(call)                                               \
  do {                                                               \
    if ((call) < 0) ::gpt2::h5::h5_throw(#call, __FILE__, __LINE__); \
  } while (0)

// Like H5_CHECK, but yields the (non-negative) id or value: hid_t f = H5_ID(H5Fopen(...)).
inline hid_t h5_checked(hid_t id, const char* call, const char* file, int line) {
  if (id < 0) h5_throw(call, file, line);
  return id;
}
#define H5_ID(call) ::gpt2::h5::h5_checked((call), #call, __FILE__, __LINE__)

// Owns one HDF5 id and closes it with the matching H5?close. Move-only.
class H5Id {
 public:
  using Closer = herr_t (*)(hid_t);
  H5Id() = default;
  H5Id(hid_t id, Closer close) : id_(id), close_(close) {}
  H5Id(const H5Id&) = delete;
  H5Id& operator=(const H5Id&) = delete;
  H5Id(H5Id&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)), close_(o.close_) {}
  H5Id& operator=(H5Id&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
      close_ = o.close_;
    }
    return *this;
  }
  ~H5Id() { reset(); }

  hid_t get() const { return id_; }
  explicit operator bool() const { return id_ >= 0; }
  hid_t release() { return std::exchange(id_, H5I_INVALID_HID); }  // caller closes it now
  void reset() {
    if (id_ >= 0 && close_ != nullptr) close_(id_);  // errors on close are not actionable
    id_ = H5I_INVALID_HID;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer close_ = nullptr;
};

// While alive, HDF5 records errors without printing them (restores the previous handler after).
class H5ErrorSilencer {
 public:
  H5ErrorSilencer() {
    H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~H5ErrorSilencer() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }
  H5ErrorSilencer(const H5ErrorSilencer&) = delete;
  H5ErrorSilencer& operator=(const H5ErrorSilencer&) = delete;

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

// Opens an HDF5 file read-only; gpt2::UserError naming the path (and HDF5's reason) when it cannot.
inline H5Id open_h5(const std::string& path) {
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) {
    const std::string detail = h5_error_detail();
    throw UserError(path + ": cannot open as HDF5" + (detail.empty() ? "" : " (" + detail + ")"));
  }
  return H5Id(f, H5Fclose);
}

inline bool has_link(hid_t loc, const std::string& name) { return H5Lexists(loc, name.c_str(), H5P_DEFAULT) > 0; }

// The dataset's dims, and whether its type is a 4-byte float (fp32).
inline std::vector<hsize_t> dataset_dims(hid_t dset, bool* is_f32) {
  H5Id type(H5_ID(H5Dget_type(dset)), H5Tclose);
  *is_f32 = H5Tget_class(type.get()) == H5T_FLOAT && H5Tget_size(type.get()) == 4;
  H5Id space(H5_ID(H5Dget_space(dset)), H5Sclose);
  const int nd = H5Sget_simple_extent_ndims(space.get());
  H5_CHECK(nd);
  std::vector<hsize_t> dims(static_cast<size_t>(nd));
  if (nd > 0) H5_CHECK(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr));
  return dims;
}

// An integer attribute; false (with *why) when missing or not an integer.
inline bool read_int_attr(hid_t loc, const char* name, int64_t* value, std::string* why) {
  if (H5Aexists(loc, name) <= 0) {
    *why = "missing attribute '" + std::string(name) + "'";
    return false;
  }
  H5Id attr(H5_ID(H5Aopen(loc, name, H5P_DEFAULT)), H5Aclose);
  H5Id type(H5_ID(H5Aget_type(attr.get())), H5Tclose);
  if (H5Tget_class(type.get()) != H5T_INTEGER) {
    *why = "attribute '" + std::string(name) + "' is not an integer";
    return false;
  }
  H5_CHECK(H5Aread(attr.get(), H5T_NATIVE_INT64, value));
  return true;
}

// Scalar root/object attributes as every writer here stores them: int64 little-endian, and
// variable-length UTF-8 strings (what h5py writes for str and reads back as str).
inline void write_int_attr(hid_t loc, const char* name, int64_t value) {
  H5Id space(H5_ID(H5Screate(H5S_SCALAR)), H5Sclose);
  H5Id attr(H5_ID(H5Acreate2(loc, name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT)), H5Aclose);
  H5_CHECK(H5Awrite(attr.get(), H5T_NATIVE_INT64, &value));
}

inline void write_string_attr(hid_t loc, const char* name, const std::string& value) {
  H5Id type(H5_ID(H5Tcopy(H5T_C_S1)), H5Tclose);
  H5_CHECK(H5Tset_size(type.get(), H5T_VARIABLE));
  H5_CHECK(H5Tset_cset(type.get(), H5T_CSET_UTF8));
  H5Id space(H5_ID(H5Screate(H5S_SCALAR)), H5Sclose);
  H5Id attr(H5_ID(H5Acreate2(loc, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT)), H5Aclose);
  const char* data = value.c_str();
  H5_CHECK(H5Awrite(attr.get(), type.get(), &data));
}

}  // namespace gpt2::h5

// HDF5 pieces shared by the checkpoint and model-file code (see h5_io.h).
#include "src/io/h5_io.h"

namespace gpt2::h5 {
namespace {

// Dataset creation without modification times, so the same contents always give the same bytes.
H5Id untimed_dcpl() {
  H5Id dcpl(H5_ID(H5Pcreate(H5P_DATASET_CREATE)), H5Pclose);
  H5_CHECK(H5Pset_obj_track_times(dcpl.get(), 0));
  return dcpl;
}

void write_dataset(hid_t loc, const std::string& name, hid_t file_type, hid_t mem_type, const void* data,
                   const std::vector<hsize_t>& dims) {
  H5Id space(H5_ID(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr)), H5Sclose);
  H5Id dcpl = untimed_dcpl();
  H5Id dset(H5_ID(H5Dcreate2(loc, name.c_str(), file_type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT)),
            H5Dclose);
  hsize_t n = 1;
  for (hsize_t d : dims) n *= d;
  if (n > 0) H5_CHECK(H5Dwrite(dset.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data));
}

}  // namespace

H5Id create_h5(const std::string& path) {
  const hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (f < 0) {
    const std::string detail = h5_error_detail();
    throw UserError(path + ": cannot create" + (detail.empty() ? "" : " (" + detail + ")") +
                    " (does the directory exist and is it writable?)");
  }
  return H5Id(f, H5Fclose);
}

void write_f32(hid_t loc, const std::string& name, const float* data, const std::vector<hsize_t>& dims) {
  write_dataset(loc, name, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, data, dims);
}

void write_bytes(hid_t loc, const std::string& name, const uint8_t* data, hsize_t n) {
  write_dataset(loc, name, H5T_NATIVE_UINT8, H5T_NATIVE_UINT8, data, {n});
}

void write_i8(hid_t loc, const std::string& name, const int8_t* data, const std::vector<hsize_t>& dims) {
  write_dataset(loc, name, H5T_STD_I8LE, H5T_NATIVE_INT8, data, dims);
}

namespace {

void read_range(hid_t file, const char* name, hid_t mem_type, int64_t from, int64_t n, void* out,
                const std::string& path) {
  if (H5Lexists(file, name, H5P_DEFAULT) <= 0) throw UserError(path + ": no dataset /" + name);
  H5Id dset(H5_ID(H5Dopen2(file, name, H5P_DEFAULT)), H5Dclose);
  H5Id space(H5_ID(H5Dget_space(dset.get())), H5Sclose);
  hsize_t dims[1] = {0};
  if (H5Sget_simple_extent_ndims(space.get()) != 1) throw UserError(path + ": /" + name + " is not 1-D");
  H5_CHECK(H5Sget_simple_extent_dims(space.get(), dims, nullptr));
  if (from < 0 || n < 0 || static_cast<hsize_t>(from + n) > dims[0]) {
    throw UserError(path + ": /" + name + " has " + std::to_string(dims[0]) + " elements, the manifest needs [" +
                    std::to_string(from) + ", " + std::to_string(from + n) + ")");
  }
  if (n == 0) return;
  const hsize_t start[1] = {static_cast<hsize_t>(from)}, count[1] = {static_cast<hsize_t>(n)};
  H5_CHECK(H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, start, nullptr, count, nullptr));
  H5Id mem(H5_ID(H5Screate_simple(1, count, nullptr)), H5Sclose);
  H5_CHECK(H5Dread(dset.get(), mem_type, mem.get(), space.get(), H5P_DEFAULT, out));
}

}  // namespace

void read_f32_range(hid_t file, const char* name, int64_t from, int64_t n, float* out, const std::string& path) {
  read_range(file, name, H5T_NATIVE_FLOAT, from, n, out, path);
}

void read_u8_range(hid_t file, const char* name, int64_t from, int64_t n, uint8_t* out, const std::string& path) {
  read_range(file, name, H5T_NATIVE_UINT8, from, n, out, path);
}

std::vector<uint8_t> read_bytes(hid_t file, const char* name) {
  if (H5Lexists(file, name, H5P_DEFAULT) <= 0) return {};
  H5Id dset(H5_ID(H5Dopen2(file, name, H5P_DEFAULT)), H5Dclose);
  H5Id space(H5_ID(H5Dget_space(dset.get())), H5Sclose);
  hsize_t dims[1] = {0};
  H5_CHECK(H5Sget_simple_extent_dims(space.get(), dims, nullptr));
  std::vector<uint8_t> out(static_cast<size_t>(dims[0]));
  if (!out.empty()) H5_CHECK(H5Dread(dset.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()));
  return out;
}

int64_t read_int_attr_or_throw(hid_t loc, const char* name, const std::string& path) {
  int64_t v = 0;
  std::string why;
  if (!read_int_attr(loc, name, &v, &why)) throw UserError(path + ": " + why);
  return v;
}

}  // namespace gpt2::h5

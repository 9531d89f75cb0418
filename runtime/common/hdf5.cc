#include "runtime/common/hdf5.h"

#include <libdeflate.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>

#include "runtime/common/atomic_file.h"
#include "runtime/common/hdf5_heap.h"
#include "runtime/common/memory_budget.h"
#include "runtime/common/parallel.h"
#include "runtime/common/signals.h"

namespace eldr::h5 {

namespace {

// A file whose close failed (a full disk) stays registered in HDF5 1.10, half torn down; the library's exit
// handler would close it again and crash (exit 139). Every file is closed explicitly (RAII) before exit, so the
// handler has nothing to do: skip it. H5dont_atexit only works before the library initialises, hence a static
// initialiser (this file holds every HDF5 call of eldr); harmless if it comes late.
const bool kNoHdf5AtExit = (H5dont_atexit(), true);

void SilenceHdf5() {
  (void)kNoHdf5AtExit;
  // The C library prints its whole error stack by default; our Status messages replace it.
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

std::string ParentOf(const std::string& path) {
  auto pos = path.rfind('/');
  if (pos == std::string::npos || pos == 0) return "/";
  return path.substr(0, pos);
}

Dims ChunkFor(const Dims& dims, size_t elem_size) {
  // About 1 MiB chunks along dimension 0, whole rows.
  Dims chunk = dims;
  hsize_t row_bytes = elem_size;
  for (size_t i = 1; i < dims.size(); ++i) row_bytes *= std::max<hsize_t>(dims[i], 1);
  hsize_t rows = std::max<hsize_t>(1, (1u << 20) / std::max<hsize_t>(row_bytes, 1));
  chunk[0] = std::max<hsize_t>(1, std::min<hsize_t>(dims[0], rows));
  for (auto& c : chunk) c = std::max<hsize_t>(c, 1);
  return chunk;
}

// Reading converts the stored type to the requested one. HDF5 clamps out-of-range values by default (a stored
// -1 read as uint16 would become 0); abort the read instead, so such a file is reported, not silently fixed.
H5T_conv_ret_t AbortOnRangeError(H5T_conv_except_t except, hid_t, hid_t, void*, void*, void*) {
  switch (except) {
    case H5T_CONV_EXCEPT_RANGE_HI:
    case H5T_CONV_EXCEPT_RANGE_LOW:
    case H5T_CONV_EXCEPT_TRUNCATE:
    case H5T_CONV_EXCEPT_PINF:
    case H5T_CONV_EXCEPT_NINF:
    case H5T_CONV_EXCEPT_NAN:
      return H5T_CONV_ABORT;
    default:
      return H5T_CONV_UNHANDLED;
  }
}

Handle StrictTransfer() {
  Handle dxpl(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
  H5Pset_type_conv_cb(dxpl.get(), AbortOnRangeError, nullptr);
  return dxpl;
}

// Largest dataset a reader accepts, in bytes: far above any real trace or calibration, far below what a
// corrupt shape can claim.
constexpr hsize_t kMaxReadBytes = hsize_t{1} << 36;  // 64 GiB

}  // namespace

Handle& Handle::operator=(Handle&& o) noexcept {
  if (this != &o) {
    Reset();
    id_ = o.id_;
    closer_ = o.closer_;
    o.id_ = H5I_INVALID_HID;
  }
  return *this;
}

void Handle::Reset() { (void)Close(); }

herr_t Handle::Close() {
  herr_t rc = 0;
  if (id_ >= 0 && closer_) rc = closer_(id_);
  id_ = H5I_INVALID_HID;
  return rc;
}

namespace {

herr_t FindReason(unsigned, const H5E_error2_t* err, void* data) {
  auto* reason = static_cast<std::string*>(data);
  if (!err->desc) return 0;
  const std::string desc = err->desc;
  // The sec2 driver's "... errno = 28, error message = 'No space left on device', ..." is the one to show.
  const std::string key = "error message = '";
  const size_t pos = desc.find(key);
  if (pos != std::string::npos) {
    const size_t end = desc.find('\'', pos + key.size());
    *reason = desc.substr(pos + key.size(), end == std::string::npos ? std::string::npos : end - pos - key.size());
    return 1;  // stop: the system's reason wins
  }
  *reason = desc;  // walking downward: the last one seen is the innermost
  return 0;
}

}  // namespace

std::string LastErrorReason() {
  std::string reason;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, FindReason, &reason);
  return reason.empty() ? "HDF5 error" : reason;
}

template <>
hid_t NativeType<uint8_t>() {
  return H5T_NATIVE_UINT8;
}
template <>
hid_t NativeType<int8_t>() {
  return H5T_NATIVE_INT8;
}
template <>
hid_t NativeType<uint16_t>() {
  return H5T_NATIVE_UINT16;
}
template <>
hid_t NativeType<int32_t>() {
  return H5T_NATIVE_INT32;
}
template <>
hid_t NativeType<int64_t>() {
  return H5T_NATIVE_INT64;
}
template <>
hid_t NativeType<uint64_t>() {
  return H5T_NATIVE_UINT64;
}
template <>
hid_t NativeType<float>() {
  return H5T_NATIVE_FLOAT;
}
template <>
hid_t NativeType<double>() {
  return H5T_NATIVE_DOUBLE;
}

hid_t VarStringType() {
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, H5T_VARIABLE);
  H5Tset_cset(t, H5T_CSET_UTF8);
  return t;
}

Result<File> File::OpenReadOnly(const std::string& path) {
  SilenceHdf5();
  ELDR_RETURN_IF_ERROR(CheckInputFile(path));
  htri_t is_h5 = H5Fis_hdf5(path.c_str());
  if (is_h5 <= 0) {
    return Status::Corrupt(path + ": not an HDF5 file (wrong format, truncated or corrupt)");
  }
  hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (id < 0) return Status::Corrupt(path + ": cannot open as HDF5 (truncated or corrupt)");
  return File(Handle(id, H5Fclose), path, path, false);
}

Result<File> File::Create(const std::string& path, const std::string& display_name) {
  SilenceHdf5();
  hid_t id = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (id < 0) return Status::IoError(display_name + ": cannot create HDF5 file: " + LastErrorReason());
  return File(Handle(id, H5Fclose), path, display_name, true);
}

Result<File> File::OpenReadWrite(const std::string& path, const std::string& display_name) {
  SilenceHdf5();
  if (H5Fis_hdf5(path.c_str()) <= 0) return Status::Corrupt(display_name + ": not an HDF5 file");
  hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  if (id < 0) return Status::IoError(display_name + ": cannot open for writing");
  return File(Handle(id, H5Fclose), path, display_name, true);
}

Status File::Remove(const std::string& object_path) {
  if (!Exists(object_path)) return Status::Ok();
  if (H5Ldelete(file_.get(), object_path.c_str(), H5P_DEFAULT) < 0) {
    return Status::IoError(name_ + ": cannot remove " + object_path + ": " + LastErrorReason());
  }
  return Status::Ok();
}

Status File::Close() {
  if (!file_.valid()) return Status::Ok();
  Status st;
  if (H5Fflush(file_.get(), H5F_SCOPE_GLOBAL) < 0) st = Status::IoError(name_ + ": cannot flush: " + LastErrorReason());
  // Closed even after a failed flush, so the handle does not outlive the error.
  if (file_.Close() < 0 && st.ok()) st = Status::IoError(name_ + ": cannot close: " + LastErrorReason());
  return st;
}

Status File::Fail(const std::string& what) const { return Status::Corrupt(name_ + ": " + what); }

bool File::Exists(const std::string& object_path) const {
  if (object_path == "/") return true;
  // Check each component so that a missing parent is not an error.
  std::string partial;
  size_t pos = 1;
  while (pos <= object_path.size()) {
    size_t next = object_path.find('/', pos);
    if (next == std::string::npos) next = object_path.size();
    partial = object_path.substr(0, next);
    if (H5Lexists(file_.get(), partial.c_str(), H5P_DEFAULT) <= 0) return false;
    pos = next + 1;
  }
  return true;
}

Status File::CreateGroup(const std::string& group_path) {
  if (Exists(group_path)) return Status::Ok();
  Handle g(H5Gcreate2(file_.get(), group_path.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
  if (!g.valid() || g.Close() < 0) {
    return Status::IoError(name_ + ": cannot create group " + group_path + ": " + LastErrorReason());
  }
  return Status::Ok();
}

Result<std::vector<std::string>> File::Members(const std::string& group_path) const {
  Handle g(H5Gopen2(file_.get(), group_path.c_str(), H5P_DEFAULT), H5Gclose);
  if (!g.valid()) return Fail(group_path + " is not a group");
  std::vector<std::string> names;
  auto collect = [](hid_t, const char* name, const H5L_info_t*, void* out) -> herr_t {
    static_cast<std::vector<std::string>*>(out)->emplace_back(name);
    return 0;
  };
  hsize_t index = 0;
  if (H5Literate(g.get(), H5_INDEX_NAME, H5_ITER_INC, &index, collect, &names) < 0) {
    return Fail("cannot list the members of " + group_path);
  }
  return names;
}

namespace {

Status WriteAttrRaw(hid_t file, const std::string& name, const std::string& obj, const std::string& attr, hid_t type,
                    const void* value) {
  const auto fail = [&] {
    return Status::IoError(name + ": cannot write attribute " + obj + "@" + attr + ": " + LastErrorReason());
  };
  if (type < 0) return fail();
  Handle o(H5Oopen(file, obj.c_str(), H5P_DEFAULT), H5Oclose);
  if (!o.valid()) return Status::IoError(name + ": no object " + obj + " for attribute " + attr);
  const htri_t exists = H5Aexists(o.get(), attr.c_str());
  if (exists < 0 || (exists > 0 && H5Adelete(o.get(), attr.c_str()) < 0)) return fail();
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  if (!space.valid()) return fail();
  Handle a(H5Acreate2(o.get(), attr.c_str(), type, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!a.valid() || H5Awrite(a.get(), type, value) < 0 || a.Close() < 0 || o.Close() < 0) return fail();
  return Status::Ok();
}

}  // namespace

namespace {
bool IsUtf8(const std::string& s);  // below, beside the readers that require it

// A string the readers would refuse (not UTF-8) or cut short (a NUL inside) is not written: one error naming it.
Status CheckWritableString(const std::string& file, const std::string& where, const std::string& value) {
  if (value.find('\0') != std::string::npos) return Status::InvalidArgument(file + ": " + where + " holds a NUL byte");
  if (!IsUtf8(value)) return Status::InvalidArgument(file + ": " + where + " is not valid UTF-8");
  return Status::Ok();
}
}  // namespace

Status File::WriteAttribute(const std::string& obj, const std::string& attr, const std::string& value) {
  ELDR_RETURN_IF_ERROR(CheckWritableString(name_, "attribute " + obj + "@" + attr, value));
  Handle t(VarStringType(), H5Tclose);
  const char* p = value.c_str();
  return WriteAttrRaw(file_.get(), name_, obj, attr, t.get(), &p);
}
Status File::WriteAttribute(const std::string& obj, const std::string& attr, int64_t value) {
  return WriteAttrRaw(file_.get(), name_, obj, attr, H5T_NATIVE_INT64, &value);
}
Status File::WriteAttribute(const std::string& obj, const std::string& attr, double value) {
  return WriteAttrRaw(file_.get(), name_, obj, attr, H5T_NATIVE_DOUBLE, &value);
}

namespace {

// Whether `s` is well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
bool IsUtf8(const std::string& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned c = p[i];
    size_t len;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      len = 2, cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3, cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4, cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > n) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF))) {
      return false;
    }
    i += len;
  }
  return true;
}

}  // namespace

// The attribute `attr` of `obj`, opened if it exists and holds exactly one value (a scalar or a one-element array):
// H5Aread writes every element of an attribute, so a larger one would overrun the reader's single value.
bool File::FlushForRawRead() const { return !writable_ || H5Fflush(file_.get(), H5F_SCOPE_LOCAL) >= 0; }

bool File::HasAttribute(const std::string& obj, const std::string& attr) const {
  return Exists(obj) && H5Aexists_by_name(file_.get(), obj.c_str(), attr.c_str(), H5P_DEFAULT) > 0;
}

Result<Handle> File::OpenSingleAttribute(const std::string& obj, const std::string& attr) const {
  if (!HasAttribute(obj, attr)) return Fail("missing attribute " + obj + "@" + attr);
  Handle a(H5Aopen_by_name(file_.get(), obj.c_str(), attr.c_str(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!a.valid()) return Fail("cannot open attribute " + obj + "@" + attr + " (corrupt file)");
  Handle space(H5Aget_space(a.get()), H5Sclose);
  const hssize_t n = space.valid() ? H5Sget_simple_extent_npoints(space.get()) : -1;
  if (n != 1) {
    return Fail("attribute " + obj + "@" + attr + " must hold one value, not " +
                (n < 0 ? std::string("an unreadable dataspace") : std::to_string(n)));
  }
  return a;
}

Result<std::string> File::ReadStringAttribute(const std::string& obj, const std::string& attr) const {
  ELDR_ASSIGN_OR_RETURN(Handle a, OpenSingleAttribute(obj, attr));
  Handle ftype(H5Aget_type(a.get()), H5Tclose);
  if (!ftype.valid() || H5Tget_class(ftype.get()) != H5T_STRING)
    return Fail("attribute " + obj + "@" + attr + " is not a string");
  std::string s;
  if (H5Tis_variable_str(ftype.get()) > 0) {
    if (!FlushForRawRead() || CheckAttributeStrings(file_.get(), obj, attr, path_, 1) == HeapCheck::kCorrupt) {
      return Fail("the string of attribute " + obj + "@" + attr + " points outside its heap (corrupt file)");
    }
    Handle t(VarStringType(), H5Tclose);
    char* p = nullptr;
    if (H5Aread(a.get(), t.get(), &p) < 0) return Fail("cannot read attribute " + obj + "@" + attr);
    s = p ? p : "";
    H5free_memory(p);
  } else {
    const size_t n = H5Tget_size(ftype.get());
    s.assign(n, '\0');
    if (H5Aread(a.get(), ftype.get(), s.data()) < 0) return Fail("cannot read attribute " + obj + "@" + attr);
    s.resize(strnlen(s.c_str(), n));
  }
  if (!IsUtf8(s)) return Fail("attribute " + obj + "@" + attr + " is not valid UTF-8");
  return s;
}

Result<int64_t> File::ReadIntAttribute(const std::string& obj, const std::string& attr) const {
  ELDR_ASSIGN_OR_RETURN(Handle a, OpenSingleAttribute(obj, attr));
  Handle ftype(H5Aget_type(a.get()), H5Tclose);
  if (!ftype.valid() || H5Tget_class(ftype.get()) != H5T_INTEGER) {
    return Fail("attribute " + obj + "@" + attr + " is not an integer");
  }
  int64_t v = 0;
  if (H5Aread(a.get(), H5T_NATIVE_INT64, &v) < 0) return Fail("cannot read attribute " + obj + "@" + attr);
  return v;
}

Result<double> File::ReadDoubleAttribute(const std::string& obj, const std::string& attr) const {
  ELDR_ASSIGN_OR_RETURN(Handle a, OpenSingleAttribute(obj, attr));
  Handle ftype(H5Aget_type(a.get()), H5Tclose);
  const auto cls = ftype.valid() ? H5Tget_class(ftype.get()) : H5T_NO_CLASS;
  if (cls != H5T_FLOAT && cls != H5T_INTEGER) return Fail("attribute " + obj + "@" + attr + " is not a number");
  double v = 0;
  if (H5Aread(a.get(), H5T_NATIVE_DOUBLE, &v) < 0) return Fail("cannot read attribute " + obj + "@" + attr);
  return v;
}

Status File::WriteRaw(const std::string& path, hid_t type, const void* data, const Dims& dims, const Filters& filters,
                      int num_threads) {
  if (Interrupted()) return InterruptStatus().WithPrefix(name_);
  ELDR_RETURN_IF_ERROR(CreateGroup(ParentOf(path)));
  const auto fail = [&](const char* what) {
    return Status::IoError(name_ + ": cannot " + what + " dataset " + path + ": " + LastErrorReason());
  };
  if (type < 0) return fail("create");
  Handle space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
  Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  if (!space.valid() || !dcpl.valid()) return fail("create");
  hsize_t total = 1;
  for (auto d : dims) total *= d;
  const bool chunked = (filters.shuffle || filters.deflate_level > 0) && total > 0;
  const size_t elem_size = H5Tget_size(type);
  Dims chunk;
  if (chunked) {
    chunk = ChunkFor(dims, elem_size);
    if (H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()) < 0 ||
        (filters.shuffle && H5Pset_shuffle(dcpl.get()) < 0) ||
        (filters.deflate_level > 0 && H5Pset_deflate(dcpl.get(), static_cast<unsigned>(filters.deflate_level)) < 0)) {
      return fail("create");
    }
  }
  Handle ds(H5Dcreate2(file_.get(), path.c_str(), type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT), H5Dclose);
  if (!ds.valid()) return fail("create");
  if (chunked) {
    ELDR_RETURN_IF_ERROR(WriteChunks(ds.get(), path, static_cast<const unsigned char*>(data), elem_size, dims, chunk,
                                     filters, num_threads));
  } else if (total > 0 && H5Dwrite(ds.get(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0) {
    return fail("write");
  }
  // The chunks of a compressed dataset are flushed by the close: its failure is the write's.
  if (ds.Close() < 0) return fail("write");
  return Status::Ok();
}

namespace {

// HDF5's shuffle filter (H5Z_filter_shuffle): byte b of element i goes to dst[b * num_elems + i].
template <size_t kSize>
void Shuffle(const unsigned char* src, size_t num_elems, unsigned char* dst) {
  for (size_t i = 0; i < num_elems; ++i) {
    for (size_t b = 0; b < kSize; ++b) dst[b * num_elems + i] = src[i * kSize + b];
  }
}

void Shuffle(const unsigned char* src, size_t size, size_t num_elems, unsigned char* dst) {
  switch (size) {
    case 1:
      std::memcpy(dst, src, num_elems);
      return;
    case 2:
      return Shuffle<2>(src, num_elems, dst);
    case 4:
      return Shuffle<4>(src, num_elems, dst);
    case 8:
      return Shuffle<8>(src, num_elems, dst);
    default:
      for (size_t i = 0; i < num_elems; ++i) {
        for (size_t b = 0; b < size; ++b) dst[b * num_elems + i] = src[i * size + b];
      }
  }
}

// One chunk's bytes as the filter pipeline leaves them, for H5Dwrite_chunk.
struct EncodedChunk {
  hsize_t first_row = 0;
  std::vector<unsigned char> bytes;
};

// Raw bytes per batch of chunks encoded before they are stored: bounds the memory of a large dataset.
constexpr size_t kWriteBatchBytes = size_t{64} << 20;

}  // namespace

Status File::WriteChunks(hid_t ds, const std::string& path, const unsigned char* data, size_t elem_size,
                         const Dims& dims, const Dims& chunk, const Filters& filters, int num_threads) {
  size_t row_bytes = elem_size;
  for (size_t i = 1; i < dims.size(); ++i) row_bytes *= dims[i];
  const size_t chunk_bytes = chunk[0] * row_bytes;
  const hsize_t num_chunks = (dims[0] + chunk[0] - 1) / chunk[0];
  const size_t per_batch = std::max<size_t>(1, kWriteBatchBytes / chunk_bytes);
  const int threads = num_threads > 0 ? num_threads : DefaultThreads();
  std::vector<EncodedChunk> batch;
  for (hsize_t first = 0; first < num_chunks; first += per_batch) {
    if (Interrupted()) return InterruptStatus().WithPrefix(name_);
    const size_t used = std::min<size_t>(per_batch, num_chunks - first);
    batch.resize(used);
    // Encode on the workers: each chunk as HDF5's pipeline would, over the whole chunk (the rows past the end of a
    // partial last chunk are the fill value, zero).
    std::vector<uint8_t> ok(used, 1);
    const int workers = static_cast<int>(std::min<size_t>(std::max(threads, 1), used));
    ParallelFor(
        workers,
        [&](int64_t w) {
          std::vector<unsigned char> padded, shuffled;
          for (size_t i = w; i < used; i += workers) {
            EncodedChunk& c = batch[i];
            c.first_row = (first + i) * chunk[0];
            const size_t valid = std::min<hsize_t>(chunk[0], dims[0] - c.first_row) * row_bytes;
            const unsigned char* src = data + c.first_row * row_bytes;
            if (valid < chunk_bytes) {
              padded.assign(chunk_bytes, 0);
              std::memcpy(padded.data(), src, valid);
              src = padded.data();
            }
            if (filters.shuffle) {
              shuffled.resize(chunk_bytes);
              Shuffle(src, elem_size, chunk_bytes / elem_size, shuffled.data());
              src = shuffled.data();
            }
            if (filters.deflate_level <= 0) {
              c.bytes.assign(src, src + chunk_bytes);
              continue;
            }
            uLongf len = compressBound(chunk_bytes);
            c.bytes.resize(len);
            ok[i] = compress2(c.bytes.data(), &len, src, chunk_bytes, filters.deflate_level) == Z_OK;
            c.bytes.resize(len);
          }
        },
        workers);
    // ... then store them in order on this thread.
    for (size_t i = 0; i < used; ++i) {
      const EncodedChunk& c = batch[i];
      if (!ok[i]) return Status::IoError(name_ + ": cannot compress dataset " + path);
      Dims offset(dims.size(), 0);
      offset[0] = c.first_row;
      if (H5Dwrite_chunk(ds, H5P_DEFAULT, 0, offset.data(), c.bytes.size(), c.bytes.data()) < 0) {
        return Status::IoError(name_ + ": cannot write dataset " + path + ": " + LastErrorReason());
      }
    }
  }
  return Status::Ok();
}

template <typename T>
Status File::Write(const std::string& path, const std::vector<T>& data, const Dims& dims, bool compress) {
  return Write(path, data, dims, compress ? Filters{} : Filters{false, 0});
}

template <typename T>
Status File::Write(const std::string& path, const std::vector<T>& data, const Dims& dims, const Filters& filters,
                   int num_threads) {
  hsize_t total = 1;
  for (auto d : dims) total *= d;
  if (total != data.size()) {
    return Status::InvalidArgument(name_ + ": dataset " + path + ": data size does not match its shape");
  }
  return WriteRaw(path, NativeType<T>(), data.data(), dims, filters, num_threads);
}

Status File::WriteStrings(const std::string& path, const std::vector<std::string>& values) {
  for (size_t i = 0; i < values.size(); ++i) {
    ELDR_RETURN_IF_ERROR(CheckWritableString(name_, path + " entry " + std::to_string(i), values[i]));
  }
  std::vector<const char*> ptrs(values.size());
  for (size_t i = 0; i < values.size(); ++i) ptrs[i] = values[i].c_str();
  Handle t(VarStringType(), H5Tclose);
  return WriteRaw(path, t.get(), ptrs.data(), Dims{values.size()}, Filters{false, 0}, 1);
}

Result<Dims> File::Shape(const std::string& path) const {
  if (!Exists(path)) return Fail("missing dataset " + path);
  Handle ds(H5Dopen2(file_.get(), path.c_str(), H5P_DEFAULT), H5Dclose);
  if (!ds.valid()) return Fail(path + " is not a dataset");
  Handle space(H5Dget_space(ds.get()), H5Sclose);
  int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 0) return Fail("cannot read the shape of " + path);
  Dims dims(rank);
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  return dims;
}

Status File::ReadRaw(const std::string& path, hid_t type, size_t elem_size, std::vector<char>* out, Dims* dims,
                     int expected_rank) const {
  ELDR_ASSIGN_OR_RETURN(Dims shape, Shape(path));
  if (expected_rank >= 0 && static_cast<int>(shape.size()) != expected_rank) {
    return Fail(path + " has rank " + std::to_string(shape.size()) + ", expected " + std::to_string(expected_rank));
  }
  Handle ds(H5Dopen2(file_.get(), path.c_str(), H5P_DEFAULT), H5Dclose);
  Handle ftype(H5Dget_type(ds.get()), H5Tclose);
  H5T_class_t fcls = H5Tget_class(ftype.get());
  H5T_class_t mcls = H5Tget_class(type);
  if (fcls != mcls && !(fcls == H5T_INTEGER && mcls == H5T_FLOAT)) {
    return Fail(path + " has the wrong element type");
  }
  hsize_t total = 1;
  for (auto d : shape) {
    if (d != 0 && total > kMaxReadBytes / d) return Fail(path + " claims an impossible size (corrupt shape)");
    total *= d;
  }
  if (total > kMaxReadBytes / elem_size) return Fail(path + " is larger than 64 GiB (corrupt shape?)");
  // Read<T> holds the raw bytes and their typed copy at once.
  ELDR_RETURN_IF_ERROR(CheckMemoryBudget(2.0 * static_cast<double>(total) * static_cast<double>(elem_size),
                                         name_ + ": reading " + path));
  out->resize(total * elem_size);
  Handle dxpl = StrictTransfer();
  if (total > 0 && H5Dread(ds.get(), type, H5S_ALL, H5S_ALL, dxpl.get(), out->data()) < 0) {
    return Fail("cannot read dataset " + path +
                " (a value outside the range of its type, or a truncated or corrupt file)");
  }
  if (dims) *dims = shape;
  return Status::Ok();
}

template <typename T>
Result<std::vector<T>> File::Read(const std::string& path, Dims* dims, int expected_rank) const {
  std::vector<char> raw;
  ELDR_RETURN_IF_ERROR(ReadRaw(path, NativeType<T>(), sizeof(T), &raw, dims, expected_rank));
  std::vector<T> v(raw.size() / sizeof(T));
  if (!raw.empty()) std::memcpy(v.data(), raw.data(), raw.size());
  return v;
}

template <typename T>
Status File::ReadRows(const std::string& path, hsize_t row_begin, hsize_t num_rows, std::vector<T>* out) const {
  ELDR_ASSIGN_OR_RETURN(Dims shape, Shape(path));
  if (shape.empty() || row_begin + num_rows > shape[0]) {
    return Fail(path + ": rows " + std::to_string(row_begin) + "+" + std::to_string(num_rows) + " out of range");
  }
  Handle ds(H5Dopen2(file_.get(), path.c_str(), H5P_DEFAULT), H5Dclose);
  Handle fspace(H5Dget_space(ds.get()), H5Sclose);
  Dims start(shape.size(), 0), count = shape;
  start[0] = row_begin;
  count[0] = num_rows;
  H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
  Handle mspace(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr), H5Sclose);
  hsize_t total = 1;
  for (auto c : count) total *= c;
  if (total > kMaxReadBytes / sizeof(T)) return Fail(path + " selection is larger than 64 GiB");
  ELDR_RETURN_IF_ERROR(
      CheckMemoryBudget(static_cast<double>(total) * static_cast<double>(sizeof(T)), name_ + ": reading " + path));
  out->resize(total);
  Handle dxpl = StrictTransfer();
  if (total > 0 && H5Dread(ds.get(), NativeType<T>(), mspace.get(), fspace.get(), dxpl.get(), out->data()) < 0) {
    return Fail("cannot read dataset " + path + " (truncated or corrupt file)");
  }
  return Status::Ok();
}

namespace {

// What the direct chunk read undoes by hand: the dataset's pipeline is [shuffle,] [deflate] in that order.
struct ChunkLayout {
  Dims chunk;  // chunk dims; chunk[i] == shape[i] for i >= 1
  bool shuffle = false, deflate = false;
  uint32_t shuffle_bit = 0, deflate_bit = 0;  // the filters' bits in a chunk's filter mask (set: not applied)
};

// Whether ReadParallel can read `ds` by direct chunk reads; fills `layout` when it can.
bool DirectLayout(hid_t ds, hid_t mem_type, const Dims& shape, ChunkLayout* layout) {
  Handle dcpl(H5Dget_create_plist(ds), H5Pclose);
  Handle ftype(H5Dget_type(ds), H5Tclose);
  if (!dcpl.valid() || !ftype.valid() || H5Pget_layout(dcpl.get()) != H5D_CHUNKED) return false;
  if (H5Tequal(ftype.get(), mem_type) <= 0 || shape.empty()) return false;
  const int rank = static_cast<int>(shape.size());
  layout->chunk.assign(rank, 0);
  if (H5Pget_chunk(dcpl.get(), rank, layout->chunk.data()) != rank || layout->chunk[0] == 0) return false;
  for (int i = 1; i < rank; ++i) {
    if (layout->chunk[i] != shape[i]) return false;
  }
  unsigned opts = 0;
  if (H5Pget_chunk_opts(dcpl.get(), &opts) < 0 || (opts & H5D_CHUNK_DONT_FILTER_PARTIAL_CHUNKS)) return false;
  const int num_filters = H5Pget_nfilters(dcpl.get());
  if (num_filters < 0 || num_filters > 2) return false;
  for (int f = 0; f < num_filters; ++f) {
    unsigned flags = 0, config = 0, cd[8];
    size_t num_cd = 8;
    char name[64];
    const H5Z_filter_t id = H5Pget_filter2(dcpl.get(), f, &flags, &num_cd, cd, sizeof(name), name, &config);
    if (id == H5Z_FILTER_SHUFFLE && f == 0) {
      layout->shuffle = true;
      layout->shuffle_bit = 1u << f;
    } else if (id == H5Z_FILTER_DEFLATE && !layout->deflate) {
      layout->deflate = true;
      layout->deflate_bit = 1u << f;
    } else {
      return false;
    }
  }
  return true;
}

// Undoes HDF5's shuffle of `num_elems` elements of `size` bytes (byte b of element i at src[b * num_elems + i]),
// writing the first `num_out` elements to dst.
template <size_t kSize>
void Unshuffle(const unsigned char* src, size_t num_elems, size_t num_out, unsigned char* dst) {
  for (size_t i = 0; i < num_out; ++i) {
    for (size_t b = 0; b < kSize; ++b) dst[i * kSize + b] = src[b * num_elems + i];
  }
}

void Unshuffle(const unsigned char* src, size_t size, size_t num_elems, size_t num_out, unsigned char* dst) {
  switch (size) {
    case 1:
      std::memcpy(dst, src, num_out);
      return;
    case 2:
      return Unshuffle<2>(src, num_elems, num_out, dst);
    case 4:
      return Unshuffle<4>(src, num_elems, num_out, dst);
    case 8:
      return Unshuffle<8>(src, num_elems, num_out, dst);
    default:
      for (size_t i = 0; i < num_out; ++i) {
        for (size_t b = 0; b < size; ++b) dst[i * size + b] = src[b * num_elems + i];
      }
  }
}

// One chunk's stored bytes, as H5Dread_chunk gave them.
struct StoredChunk {
  hsize_t first_row = 0;
  uint32_t filter_mask = 0;
  std::vector<unsigned char> bytes;
};

// A worker's state for decoding chunks: a buffer of chunk_bytes and its inflater. Chunks are inflated by libdeflate
// (whole-buffer, about 2x zlib's inflate; the output is the same bytes: a deflate stream has one decoding), while
// every deflate this project writes stays zlib's, byte for byte what HDF5's own filter writes.
struct ChunkScratch {
  std::vector<unsigned char> bytes;
  std::unique_ptr<libdeflate_decompressor, void (*)(libdeflate_decompressor*)> inflater{libdeflate_alloc_decompressor(),
                                                                                        libdeflate_free_decompressor};
};

// Decodes one stored chunk into its rows of the result. dst: [valid_bytes]; scratch: the worker's.
bool DecodeChunk(const StoredChunk& c, const ChunkLayout& layout, size_t elem_size, size_t chunk_bytes,
                 size_t valid_bytes, unsigned char* dst, ChunkScratch* scratch) {
  const bool inflate = layout.deflate && !(c.filter_mask & layout.deflate_bit);
  const bool unshuffle = layout.shuffle && !(c.filter_mask & layout.shuffle_bit);
  const unsigned char* data = c.bytes.data();
  if (inflate) {
    // A whole chunk without shuffle inflates straight into place; a partial or shuffled one goes through scratch.
    unsigned char* target = (!unshuffle && valid_bytes == chunk_bytes) ? dst : scratch->bytes.data();
    size_t len = 0;
    if (!scratch->inflater ||
        libdeflate_zlib_decompress(scratch->inflater.get(), data, c.bytes.size(), target, chunk_bytes, &len) !=
            LIBDEFLATE_SUCCESS ||
        len != chunk_bytes) {
      return false;
    }
    data = target;
  } else if (c.bytes.size() != chunk_bytes) {
    return false;
  }
  if (unshuffle) {
    Unshuffle(data, elem_size, chunk_bytes / elem_size, valid_bytes / elem_size, dst);
  } else if (data != dst) {
    std::memcpy(dst, data, valid_bytes);
  }
  return true;
}

// Compressed bytes fetched per batch before the workers inflate it: bounds memory on a large trace.
constexpr size_t kBatchBytes = size_t{64} << 20;

// The direct chunk read of a dataset DirectLayout accepted: the stored size of every chunk, checked before any is
// decoded, so that a layout the direct path cannot take falls back to the library before anything was consumed.
struct DirectPlan {
  Dims shape;
  ChunkLayout layout;
  size_t row_bytes = 0, chunk_bytes = 0;
  std::vector<hsize_t> stored;  // [num_chunks] bytes on disk
  hsize_t num_chunks() const { return stored.size(); }
  hsize_t first_row(hsize_t i) const { return i * layout.chunk[0]; }
  hsize_t rows(hsize_t i) const { return std::min<hsize_t>(layout.chunk[0], shape[0] - first_row(i)); }
};

// Fills `plan` and returns true when every chunk of `ds` (shape `shape`, elements of `elem_size` bytes, stored as
// `mem_type`) can be read by H5Dread_chunk and decoded by hand; false: read it with the library.
bool PlanDirectRead(hid_t ds, hid_t mem_type, size_t elem_size, const Dims& shape, DirectPlan* plan) {
  if (!DirectLayout(ds, mem_type, shape, &plan->layout)) return false;
  hsize_t row_elems = 1;
  for (size_t i = 1; i < shape.size(); ++i) row_elems *= shape[i];
  if (row_elems == 0 || shape[0] > kMaxReadBytes / elem_size / row_elems ||
      plan->layout.chunk[0] > kMaxReadBytes / elem_size / row_elems) {
    return false;  // the library's checks give the error
  }
  plan->shape = shape;
  plan->row_bytes = row_elems * elem_size;
  plan->chunk_bytes = plan->layout.chunk[0] * plan->row_bytes;
  const hsize_t num_chunks = (shape[0] + plan->layout.chunk[0] - 1) / plan->layout.chunk[0];
  plan->stored.assign(num_chunks, 0);
  for (hsize_t i = 0; i < num_chunks; ++i) {
    Dims offset(shape.size(), 0);
    offset[0] = plan->first_row(i);
    hsize_t stored = 0;
    if (H5Dget_chunk_storage_size(ds, offset.data(), &stored) < 0 || stored == 0 ||
        stored > plan->chunk_bytes + plan->chunk_bytes / 2 + 4096) {
      return false;  // unallocated (fill value) or odd: the library's path
    }
    plan->stored[i] = stored;
  }
  return true;
}

// Fetches the chunks of `plan` in batches of about kBatchBytes on the calling thread (HDF5 is not thread-safe) and
// calls decode(chunk, worker, scratch) -> bool for each on `threads` workers; scratch is the worker's ChunkScratch
// (a buffer of chunk_bytes). False from decode: the chunk is corrupt.
template <typename Decode>
Status ForEachDirectChunk(hid_t ds, const DirectPlan& plan, int threads, const std::string& where, Decode decode) {
  std::vector<StoredChunk> batch;
  std::vector<ChunkScratch> scratch(std::max(threads, 1));
  hsize_t next = 0;
  while (next < plan.num_chunks()) {
    size_t batch_bytes = 0, used = 0;
    for (; next < plan.num_chunks() && batch_bytes < kBatchBytes; ++next, ++used) {
      Dims offset(plan.shape.size(), 0);
      offset[0] = plan.first_row(next);
      if (used == batch.size()) batch.emplace_back();
      StoredChunk& c = batch[used];
      c.first_row = offset[0];
      c.bytes.resize(plan.stored[next]);
      if (H5Dread_chunk(ds, H5P_DEFAULT, offset.data(), &c.filter_mask, c.bytes.data()) < 0) {
        return Status::Corrupt(where + " (truncated or corrupt file)");
      }
      batch_bytes += c.bytes.size();
    }
    std::vector<uint8_t> ok(used, 0);
    const int workers = static_cast<int>(std::min<size_t>(std::max(threads, 1), used));
    ParallelFor(
        workers,
        [&](int64_t w) {
          scratch[w].bytes.resize(plan.chunk_bytes);
          for (size_t i = w; i < used; i += workers) ok[i] = decode(batch[i], static_cast<int>(w), &scratch[w]);
        },
        workers);
    for (size_t i = 0; i < used; ++i) {
      if (!ok[i]) {
        return Status::Corrupt(where + ": chunk at row " + std::to_string(batch[i].first_row) +
                               " does not decompress (truncated or corrupt file)");
      }
    }
  }
  return Status::Ok();
}

// Rows handed to a RowBlockConsumer at a time when the library reads the dataset (about 1 MiB).
hsize_t FallbackBlockRows(size_t row_bytes) {
  return std::max<hsize_t>(1, (hsize_t{1} << 20) / std::max<size_t>(row_bytes, 1));
}

}  // namespace

template <typename T>
Result<std::vector<T>> File::ReadParallel(const std::string& path, Dims* dims, int expected_rank, int num_threads,
                                          bool* direct) const {
  if (direct) *direct = false;
  ELDR_ASSIGN_OR_RETURN(Dims shape, Shape(path));
  Handle ds(H5Dopen2(file_.get(), path.c_str(), H5P_DEFAULT), H5Dclose);
  DirectPlan plan;
  if (!ds.valid() || (expected_rank >= 0 && static_cast<int>(shape.size()) != expected_rank) ||
      !PlanDirectRead(ds.get(), NativeType<T>(), sizeof(T), shape, &plan)) {
    return Read<T>(path, dims, expected_rank);
  }
  ELDR_RETURN_IF_ERROR(CheckMemoryBudget(static_cast<double>(shape[0]) * static_cast<double>(plan.row_bytes),
                                         name_ + ": reading " + path));
  std::vector<T> out(shape[0] * (plan.row_bytes / sizeof(T)));
  unsigned char* base = reinterpret_cast<unsigned char*>(out.data());
  const int threads = num_threads > 0 ? num_threads : DefaultThreads();
  // Each chunk decodes straight into its own rows of the result.
  ELDR_RETURN_IF_ERROR(
      ForEachDirectChunk(ds.get(), plan, threads, name_ + ": cannot read dataset " + path,
                         [&](const StoredChunk& c, int, ChunkScratch* scratch) {
                           const hsize_t rows = std::min<hsize_t>(plan.layout.chunk[0], shape[0] - c.first_row);
                           return DecodeChunk(c, plan.layout, sizeof(T), plan.chunk_bytes, rows * plan.row_bytes,
                                              base + c.first_row * plan.row_bytes, scratch);
                         }));
  if (dims) *dims = shape;
  if (direct) *direct = true;
  return out;
}

template <typename T>
Status File::ReadRowBlocks(const std::string& path, int expected_rank, int num_threads,
                           const RowBlockConsumer<T>& consume, Dims* dims, bool* direct, bool allow_direct) const {
  if (direct) *direct = false;
  ELDR_ASSIGN_OR_RETURN(Dims shape, Shape(path));
  if (shape.empty() || (expected_rank >= 0 && static_cast<int>(shape.size()) != expected_rank)) {
    return Fail(path + " has rank " + std::to_string(shape.size()) + ", expected " +
                (expected_rank >= 0 ? std::to_string(expected_rank) : std::string(">= 1")));
  }
  if (dims) *dims = shape;
  Handle ds(H5Dopen2(file_.get(), path.c_str(), H5P_DEFAULT), H5Dclose);
  const int threads = num_threads > 0 ? num_threads : DefaultThreads();
  DirectPlan plan;
  if (allow_direct && ds.valid() && PlanDirectRead(ds.get(), NativeType<T>(), sizeof(T), shape, &plan)) {
    // A chunk decodes into the worker's buffer (a shuffled or partial one through a second), whose rows are the
    // block: the rows stay in the worker's cache between the inflate and the consumer.
    std::vector<std::vector<unsigned char>> blocks(threads);
    ELDR_RETURN_IF_ERROR(ForEachDirectChunk(
        ds.get(), plan, threads, name_ + ": cannot read dataset " + path,
        [&](const StoredChunk& c, int worker, ChunkScratch* scratch) {
          const hsize_t rows = std::min<hsize_t>(plan.layout.chunk[0], shape[0] - c.first_row);
          std::vector<unsigned char>& block = blocks[worker];
          block.resize(plan.chunk_bytes);
          if (!DecodeChunk(c, plan.layout, sizeof(T), plan.chunk_bytes, rows * plan.row_bytes, block.data(), scratch)) {
            return false;
          }
          consume(c.first_row, rows, reinterpret_cast<const T*>(block.data()), worker);
          return true;
        }));
    if (direct) *direct = true;
    return Status::Ok();
  }
  // The library's read (its conversions, checks and errors), handed out in blocks on the workers.
  ELDR_ASSIGN_OR_RETURN(std::vector<T> all, Read<T>(path, nullptr, expected_rank));
  const size_t row_elems = shape[0] == 0 ? 0 : all.size() / shape[0];
  const hsize_t block_rows = FallbackBlockRows(row_elems * sizeof(T));
  const int64_t num_blocks = static_cast<int64_t>((shape[0] + block_rows - 1) / block_rows);
  const int workers = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, num_blocks)));
  ParallelFor(
      workers,
      [&](int64_t w) {
        for (int64_t b = w; b < num_blocks; b += workers) {
          const hsize_t first = static_cast<hsize_t>(b) * block_rows;
          consume(first, std::min<hsize_t>(block_rows, shape[0] - first), all.data() + first * row_elems,
                  static_cast<int>(w));
        }
      },
      workers);
  return Status::Ok();
}

Result<std::vector<std::string>> File::ReadStrings(const std::string& path) const {
  ELDR_ASSIGN_OR_RETURN(Dims shape, Shape(path));
  if (shape.size() != 1) return Fail(path + " must be a 1-D string dataset");
  Handle ds(H5Dopen2(file_.get(), path.c_str(), H5P_DEFAULT), H5Dclose);
  Handle ftype(H5Dget_type(ds.get()), H5Tclose);
  if (H5Tget_class(ftype.get()) != H5T_STRING) return Fail(path + " is not a string dataset");
  std::vector<std::string> out(shape[0]);
  if (shape[0] == 0) return out;
  if (H5Tis_variable_str(ftype.get()) > 0) {
    if (!FlushForRawRead() || CheckDatasetStrings(file_.get(), ds.get(), path_, shape[0]) == HeapCheck::kCorrupt) {
      return Fail("the strings of " + path + " point outside their heap (corrupt file)");
    }
    Handle t(VarStringType(), H5Tclose);
    std::vector<char*> ptrs(shape[0], nullptr);
    if (H5Dread(ds.get(), t.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, ptrs.data()) < 0) {
      return Fail("cannot read dataset " + path + " (truncated or corrupt file)");
    }
    for (size_t i = 0; i < ptrs.size(); ++i) out[i] = ptrs[i] ? ptrs[i] : "";
    Handle space(H5Dget_space(ds.get()), H5Sclose);
    H5Dvlen_reclaim(t.get(), space.get(), H5P_DEFAULT, ptrs.data());
  } else {
    size_t n = H5Tget_size(ftype.get());
    std::vector<char> buf(n * shape[0]);
    if (H5Dread(ds.get(), ftype.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) < 0) {
      return Fail("cannot read dataset " + path + " (truncated or corrupt file)");
    }
    for (size_t i = 0; i < shape[0]; ++i) out[i] = std::string(buf.data() + i * n, strnlen(buf.data() + i * n, n));
  }
  for (size_t i = 0; i < out.size(); ++i) {
    if (!IsUtf8(out[i])) return Fail(path + " entry " + std::to_string(i) + " is not valid UTF-8");
  }
  return out;
}

Result<Appender> Appender::Create(File& file, const std::string& path, hid_t type, const Dims& row_shape,
                                  hsize_t chunk_rows, bool compress) {
  return Create(file, path, type, row_shape, chunk_rows, compress ? Filters{} : Filters{false, 0});
}

Result<Appender> Appender::Create(File& file, const std::string& path, hid_t type, const Dims& row_shape,
                                  hsize_t chunk_rows, const Filters& filters) {
  ELDR_RETURN_IF_ERROR(file.CreateGroup(ParentOf(path)));
  Dims dims{0}, maxdims{H5S_UNLIMITED}, chunk{std::max<hsize_t>(chunk_rows, 1)};
  for (auto d : row_shape) {
    dims.push_back(d);
    maxdims.push_back(d);
    chunk.push_back(std::max<hsize_t>(d, 1));
  }
  const auto fail = [&] {
    return Status::IoError(file.name() + ": cannot create dataset " + path + ": " + LastErrorReason());
  };
  Handle space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), maxdims.data()), H5Sclose);
  Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  if (!space.valid() || !dcpl.valid() || H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()) < 0) {
    return fail();
  }
  if (filters.shuffle && H5Pset_shuffle(dcpl.get()) < 0) return fail();
  if (filters.deflate_level > 0 && H5Pset_deflate(dcpl.get(), static_cast<unsigned>(filters.deflate_level)) < 0) {
    return fail();
  }
  Appender a;
  a.dataset_ =
      Handle(H5Dcreate2(file.id(), path.c_str(), type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT), H5Dclose);
  if (!a.dataset_.valid()) return fail();
  a.type_ = type;
  a.row_shape_ = row_shape;
  a.where_ = file.name() + ": " + path;
  return a;
}

Status Appender::Append(const void* data, hsize_t num_rows) {
  if (num_rows == 0) return Status::Ok();
  if (Interrupted()) return InterruptStatus().WithPrefix(where_);
  if (!dataset_.valid()) return Status::IoError(where_ + ": append after close");
  const auto fail = [&](const char* what) { return Status::IoError(where_ + ": " + what + ": " + LastErrorReason()); };
  Dims new_dims{rows_ + num_rows};
  for (auto d : row_shape_) new_dims.push_back(d);
  if (H5Dset_extent(dataset_.get(), new_dims.data()) < 0) return fail("cannot extend");
  Handle fspace(H5Dget_space(dataset_.get()), H5Sclose);
  Dims start(new_dims.size(), 0), count = new_dims;
  start[0] = rows_;
  count[0] = num_rows;
  if (!fspace.valid() ||
      H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr) < 0) {
    return fail("cannot select rows");
  }
  Handle mspace(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr), H5Sclose);
  if (!mspace.valid() || H5Dwrite(dataset_.get(), type_, mspace.get(), fspace.get(), H5P_DEFAULT, data) < 0) {
    return fail("write failed");
  }
  rows_ += num_rows;
  return Status::Ok();
}

Status Appender::Close() {
  if (dataset_.valid() && dataset_.Close() < 0) return Status::IoError(where_ + ": write failed: " + LastErrorReason());
  return Status::Ok();
}

#define ELDR_H5_INSTANTIATE(T)                                                                                         \
  template Status File::Write<T>(const std::string&, const std::vector<T>&, const Dims&, bool);                        \
  template Status File::Write<T>(const std::string&, const std::vector<T>&, const Dims&, const Filters&, int);         \
  template Result<std::vector<T>> File::Read<T>(const std::string&, Dims*, int) const;                                 \
  template Status File::ReadRows<T>(const std::string&, hsize_t, hsize_t, std::vector<T>*) const;                      \
  template Result<std::vector<T>> File::ReadParallel<T>(const std::string&, Dims*, int, int, bool*) const;             \
  template Status File::ReadRowBlocks<T>(const std::string&, int, int, const RowBlockConsumer<T>&, Dims*, bool*, bool) \
      const;
ELDR_H5_INSTANTIATE(uint8_t)
ELDR_H5_INSTANTIATE(int8_t)
ELDR_H5_INSTANTIATE(uint16_t)
ELDR_H5_INSTANTIATE(int32_t)
ELDR_H5_INSTANTIATE(int64_t)
ELDR_H5_INSTANTIATE(uint64_t)
ELDR_H5_INSTANTIATE(float)
ELDR_H5_INSTANTIATE(double)
#undef ELDR_H5_INSTANTIATE

}  // namespace eldr::h5

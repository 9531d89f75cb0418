// Thin RAII layer over the HDF5 C API. Every failure is a Status naming the file and the object, so a
// missing, truncated or corrupt file reaches the user as one clear line; on the write path every call is
// checked, including the closes that flush cached chunks, so a full disk or an I/O error is a Status with
// the system's reason, never a crash or a silently incomplete file. HDF5's own error stack
// printing is switched off on first use.
//
// Thread safety: a File is not thread-safe; the Debian HDF5 build is not thread-safe either, so use
// HDF5 from one thread at a time.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/common/status.h"

namespace eldr::h5 {

// Owns one hid_t and closes it with the matching H5?close. The destructor never throws and ignores a failed
// close (it runs on error paths, after the first error was reported); a writer that needs to know whether
// the close flushed its data calls Close().
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  ~Handle() { Reset(); }
  Handle(Handle&& o) noexcept : id_(o.id_), closer_(o.closer_) { o.id_ = H5I_INVALID_HID; }
  Handle& operator=(Handle&& o) noexcept;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void Reset();
  // Closes now and returns the close's result (negative: the flush of cached data failed). Idempotent.
  herr_t Close();

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

template <typename T>
hid_t NativeType();

using Dims = std::vector<hsize_t>;

// Receives a block of whole rows of a dataset: rows [first_row, first_row + num_rows), row-major, `rows` valid
// during the call only; `worker` in [0, threads) names the calling worker thread (no two calls in flight share
// one), so a consumer can keep per-worker state without locks.
template <typename T>
using RowBlockConsumer = std::function<void(hsize_t first_row, hsize_t num_rows, const T* rows, int worker)>;

// The filter pipeline of a chunked dataset: shuffle (byte transposition; helps deflate on small integers and
// floats), then deflate at `deflate_level` (1-9; 0: no deflate).
struct Filters {
  bool shuffle = true;
  int deflate_level = 4;
};

class File {
 public:
  // Opens an existing file read-only. NotFound / Corrupt with the path in the message.
  static Result<File> OpenReadOnly(const std::string& path);
  // Creates (truncates) `path` for writing. `display_name` is what errors call it (the final name
  // when writing to a temporary).
  static Result<File> Create(const std::string& path, const std::string& display_name);
  // Opens an existing file for writing (used on a temporary copy, renamed into place when done).
  static Result<File> OpenReadWrite(const std::string& path, const std::string& display_name);
  // Removes a group or dataset (and everything below it) if it exists.
  Status Remove(const std::string& object_path);

  const std::string& name() const { return name_; }
  hid_t id() const { return file_.get(); }
  // Flushes and closes, reporting a failed flush or close (ENOSPC, EIO) with the reason. Open datasets of the
  // file (Appender) must be closed first. The destructor closes too, ignoring errors.
  Status Close();

  bool Exists(const std::string& object_path) const;
  // Whether the object exists and has the attribute (a damaged one too: reading it then says what is wrong).
  bool HasAttribute(const std::string& object_path, const std::string& attr) const;
  Status CreateGroup(const std::string& group_path);
  // The names of a group's links (its datasets and subgroups), in name order; Corrupt when it is not a group.
  Result<std::vector<std::string>> Members(const std::string& group_path) const;

  Status WriteAttribute(const std::string& object_path, const std::string& attr, const std::string& value);
  Status WriteAttribute(const std::string& object_path, const std::string& attr, int64_t value);
  Status WriteAttribute(const std::string& object_path, const std::string& attr, double value);
  Result<std::string> ReadStringAttribute(const std::string& object_path, const std::string& attr) const;
  Result<int64_t> ReadIntAttribute(const std::string& object_path, const std::string& attr) const;
  Result<double> ReadDoubleAttribute(const std::string& object_path, const std::string& attr) const;

  // Writes a whole dataset of shape `dims` (row-major). `compress` makes it chunked (about 1 MiB chunks of whole
  // rows along dimension 0) with Filters{} (shuffle + deflate 4).
  template <typename T>
  Status Write(const std::string& path, const std::vector<T>& data, const Dims& dims, bool compress = false);
  // The same, chunked with `filters` (a filter-less Filters{false, 0} writes it contiguous). The chunks are
  // shuffled and deflated on `num_threads` threads (<= 0: DefaultThreads()) and stored with H5Dwrite_chunk on the
  // calling thread (HDF5 is not thread-safe), in the dataset's declared [shuffle,] deflate pipeline: every chunk
  // holds exactly the bytes HDF5's own filters would store (compress2 at the level, over the whole chunk, a
  // partial last chunk padded with zeros), so plain HDF5 readers (h5py, h5dump) read the file as before.
  template <typename T>
  Status Write(const std::string& path, const std::vector<T>& data, const Dims& dims, const Filters& filters,
               int num_threads = 0);
  Status WriteStrings(const std::string& path, const std::vector<std::string>& values);

  // Reads a whole dataset, converting to T. `expected_rank` (if >= 0) is checked; dims returned.
  template <typename T>
  Result<std::vector<T>> Read(const std::string& path, Dims* dims, int expected_rank = -1) const;
  Result<std::vector<std::string>> ReadStrings(const std::string& path) const;
  Result<Dims> Shape(const std::string& path) const;
  // Read<T> with the chunks decompressed on `num_threads` threads (<= 0: DefaultThreads()). The compressed bytes
  // of each chunk are fetched with H5Dread_chunk on the calling thread (HDF5 is not thread-safe), then inflated
  // with zlib and un-shuffled by hand on the workers, straight into the result: the same bytes as Read<T>.
  // Layouts it does not handle are read with Read<T>: contiguous or compact storage, filters other than
  // [shuffle,] deflate, chunks not spanning whole rows (dimensions >= 1), a stored type other than T's native
  // one, unallocated chunks, unfiltered partial edge chunks. `direct` (optional) tells which path ran.
  template <typename T>
  Result<std::vector<T>> ReadParallel(const std::string& path, Dims* dims, int expected_rank = -1, int num_threads = 0,
                                      bool* direct = nullptr) const;
  // Streams a dataset of rank >= 1 (`expected_rank` if >= 0) to `consume` in blocks of whole rows along dimension
  // 0 that cover it exactly once, called concurrently on `num_threads` workers (<= 0: DefaultThreads()) in no fixed
  // order. The layouts ReadParallel reads directly come one chunk per block, inflated into the worker's buffer
  // (memory: a batch of compressed chunks + two chunks per worker), so the rows are still in cache when consumed;
  // any other layout is read whole by Read<T> (its conversions, checks and errors) and handed out in ~1 MiB
  // blocks. `dims` gets the shape (before any block); `direct` (optional) tells which path ran. A corrupt chunk is
  // a Corrupt status, possibly after other blocks were consumed.
  // `allow_direct` false: always the library's read (tests compare the two).
  template <typename T>
  Status ReadRowBlocks(const std::string& path, int expected_rank, int num_threads, const RowBlockConsumer<T>& consume,
                       Dims* dims, bool* direct = nullptr, bool allow_direct = true) const;
  // Reads rows [row_begin, row_begin + num_rows) of a dataset along dimension 0.
  template <typename T>
  Status ReadRows(const std::string& path, hsize_t row_begin, hsize_t num_rows, std::vector<T>* out) const;

 private:
  File(Handle file, std::string path, std::string name, bool writable)
      : file_(std::move(file)), path_(std::move(path)), name_(std::move(name)), writable_(writable) {}
  // The file's bytes as the heap checks (hdf5_heap.h) read them: `path_`, flushed first when open for writing.
  bool FlushForRawRead() const;
  Status WriteRaw(const std::string& path, hid_t type, const void* data, const Dims& dims, const Filters& filters,
                  int num_threads);
  // Compresses and stores every chunk of the new chunked dataset `ds` (WriteRaw's parallel path).
  Status WriteChunks(hid_t ds, const std::string& path, const unsigned char* data, size_t elem_size, const Dims& dims,
                     const Dims& chunk, const Filters& filters, int num_threads);
  Status ReadRaw(const std::string& path, hid_t type, size_t elem_size, std::vector<char>* out, Dims* dims,
                 int expected_rank) const;
  Status Fail(const std::string& what) const;
  // The attribute, opened if it exists and holds exactly one value.
  Result<Handle> OpenSingleAttribute(const std::string& obj, const std::string& attr) const;

  Handle file_;
  std::string path_;  // where the file is (a temporary one while it is written)
  std::string name_;  // what messages call it
  bool writable_ = false;
};

// A dataset that grows along dimension 0, for streaming writers (trace import). Row shape fixed.
class Appender {
 public:
  // compress: Filters{} (shuffle + deflate 4); else no filter.
  static Result<Appender> Create(File& file, const std::string& path, hid_t type, const Dims& row_shape,
                                 hsize_t chunk_rows, bool compress);
  static Result<Appender> Create(File& file, const std::string& path, hid_t type, const Dims& row_shape,
                                 hsize_t chunk_rows, const Filters& filters);
  // Appends `num_rows` rows of row-major data of the element type given at creation.
  Status Append(const void* data, hsize_t num_rows);
  // Closes the dataset, reporting a failed flush of its cached chunks (a full disk often shows only here).
  Status Close();
  hsize_t rows() const { return rows_; }

 private:
  Handle dataset_;
  hid_t type_ = H5I_INVALID_HID;
  Dims row_shape_;
  hsize_t rows_ = 0;
  std::string where_;
};

// Writes a vector of variable-length UTF-8 strings by appending (used with Appender semantics).
hid_t VarStringType();  // caller closes with H5Tclose

// The reason of the last failed HDF5 call of this thread, from the HDF5 error stack: the system's message
// when the failure was a system call ("No space left on device"), else HDF5's innermost description.
std::string LastErrorReason();

}  // namespace eldr::h5

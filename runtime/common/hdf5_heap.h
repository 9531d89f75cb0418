// Checks on the bytes of an HDF5 file before libhdf5 reads its variable-length strings.
//
// libhdf5 1.10 copies a global heap object by the size its header claims without checking it against the heap
// (H5HG_read), so one corrupted size field crashes the process (h5dump too). These checks read the file itself
// (HDF5 File Format Specification, version 2 and 3 superblocks: "Global Heap", "Disk Format: Level 2A" object
// headers, the attribute message, the variable-length descriptor) and say whether every string an object holds
// names a heap object that exists, lies inside its collection and holds at least the string's length. They
// never call into the library's heap code; any layout they do not know is reported as such, not guessed at.
#pragma once

#include <hdf5.h>

#include <cstddef>
#include <string>

namespace eldr::h5 {

enum class HeapCheck {
  kSound,      // every string's heap object exists and holds it
  kCorrupt,    // a reference points outside the file, its collection or any object: do not let libhdf5 read it
  kUnchecked,  // a layout these checks do not parse (chunked or compact datasets, attributes in dense storage)
};

// The `n` elements of the 1-D variable-length string dataset `ds`.
HeapCheck CheckDatasetStrings(hid_t file, hid_t ds, const std::string& file_name, size_t n);

// The `n` elements of the variable-length string attribute `attr` of the object at `object_path`.
HeapCheck CheckAttributeStrings(hid_t file, const std::string& object_path, const std::string& attr,
                                const std::string& file_name, size_t n);

}  // namespace eldr::h5

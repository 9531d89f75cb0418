#include "runtime/common/hdf5_heap.h"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <vector>

#include "runtime/common/hdf5.h"

#if H5_VERSION_GE(1, 12, 0)
#include <H5VLnative.h>
#endif

namespace eldr::h5 {
namespace {

// Little-endian unsigned integer of `n` bytes (HDF5 stores the file-format fields little-endian).
uint64_t LittleEndian(const unsigned char* p, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

// The file's bytes as the format addresses them: every address is relative to the end of the user block.
class RawFile {
 public:
  RawFile(const std::string& name, uint64_t userblock) : in_(name, std::ios::binary), userblock_(userblock) {
    if (in_) {
      in_.seekg(0, std::ios::end);
      const std::streamoff end = in_.tellg();
      size_ = end > 0 ? static_cast<uint64_t>(end) : 0;
    }
  }
  bool ok() const { return static_cast<bool>(in_) && size_ > userblock_; }
  // Bytes from the address to the end of the file (0 past it).
  uint64_t Left(uint64_t address) const { return address < size_ - userblock_ ? size_ - userblock_ - address : 0; }
  bool Read(uint64_t address, uint64_t n, std::vector<unsigned char>* out) {
    if (n > Left(address)) return false;
    out->resize(n);
    in_.clear();
    in_.seekg(static_cast<std::streamoff>(userblock_ + address));
    return static_cast<bool>(in_.read(reinterpret_cast<char*>(out->data()), static_cast<std::streamsize>(n)));
  }

 private:
  std::ifstream in_;
  uint64_t userblock_ = 0;
  uint64_t size_ = 0;
};

struct Sizes {
  size_t addr = 0;  // bytes of an address ("size of offsets")
  size_t size = 0;  // bytes of a length ("size of lengths")
  uint64_t userblock = 0;
};

bool FileSizes(hid_t file, Sizes* s) {
  Handle fcpl(H5Fget_create_plist(file), H5Pclose);
  hsize_t userblock = 0;
  if (!fcpl.valid() || H5Pget_sizes(fcpl.get(), &s->addr, &s->size) < 0 || H5Pget_userblock(fcpl.get(), &userblock) < 0)
    return false;
  s->userblock = userblock;
  return s->addr >= 2 && s->addr <= 8 && s->size >= 2 && s->size <= 8;
}

// `n` variable-length descriptors (a 4-byte length, then the collection's address and a 4-byte object index),
// each checked against the collection it names: a "GCOL" inside the file whose object headers stay inside it,
// holding the named object with at least the descriptor's length.
HeapCheck CheckDescriptors(RawFile& raw, const Sizes& s, const unsigned char* descs, size_t n) {
  const size_t desc = 4 + s.addr + 4;
  std::map<uint64_t, std::map<uint64_t, uint64_t>> collections;  // address -> (object index -> object size)
  std::vector<unsigned char> bytes;
  const size_t header = 8 + s.size, object_header = 8 + s.size;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char* d = descs + i * desc;
    const uint64_t length = LittleEndian(d, 4), address = LittleEndian(d + 4, s.addr);
    const uint64_t index = LittleEndian(d + 4 + s.addr, 4);
    if (length == 0) continue;  // an empty or null string: no heap object is read
    auto it = collections.find(address);
    if (it == collections.end()) {
      if (!raw.Read(address, header, &bytes) || std::memcmp(bytes.data(), "GCOL", 4) != 0 || bytes[4] != 1) {
        return HeapCheck::kCorrupt;
      }
      const uint64_t size = LittleEndian(bytes.data() + 8, s.size);
      if (size < header || !raw.Read(address, size, &bytes)) return HeapCheck::kCorrupt;
      std::map<uint64_t, uint64_t> objects;
      for (uint64_t pos = header; pos + object_header <= size;) {
        const uint64_t id = LittleEndian(bytes.data() + pos, 2);
        const uint64_t object_size = LittleEndian(bytes.data() + pos + 8, s.size);
        if (id == 0) {  // free space: its size counts its header (as the library walks it)
          if (object_size < object_header || object_size > size - pos) return HeapCheck::kCorrupt;
          pos += object_size;
          continue;
        }
        if (object_size > size) return HeapCheck::kCorrupt;
        const uint64_t padded = (object_size + 7) / 8 * 8;
        if (padded > size - pos - object_header) return HeapCheck::kCorrupt;
        objects[id] = object_size;
        pos += object_header + padded;
      }
      it = collections.emplace(address, std::move(objects)).first;
    }
    const auto object = it->second.find(index);
    if (object == it->second.end() || object->second < length) return HeapCheck::kCorrupt;
  }
  return HeapCheck::kSound;
}

uint64_t Pad8(uint64_t n) { return (n + 7) / 8 * 8; }

constexpr uint16_t kContinuationMessage = 0x0010;
constexpr uint16_t kAttributeMessage = 0x000C;

// One message of an object header chunk.
struct Message {
  uint16_t type = 0;
  const unsigned char* data = nullptr;
  uint64_t size = 0;
};

// The messages of one chunk (`v2`: the chunk's bytes without its signature and checksum; `creation_order`: whether
// each version-2 message carries a 2-byte creation order). False when a message runs past the chunk.
bool ParseChunk(const std::vector<unsigned char>& chunk, size_t begin, size_t end, bool v2, bool creation_order,
                std::vector<Message>* out) {
  const size_t head = v2 ? (creation_order ? 6 : 4) : 8;
  for (size_t pos = begin; end - pos >= head;) {
    const unsigned char* p = chunk.data() + pos;
    Message m;
    m.type = v2 ? p[0] : static_cast<uint16_t>(LittleEndian(p, 2));
    m.size = v2 ? LittleEndian(p + 1, 2) : LittleEndian(p + 2, 2);
    if (m.size > end - pos - head) return false;
    m.data = p + head;
    out->push_back(m);
    pos += head + m.size;
  }
  return true;
}

// The attribute message named `attr`, found by walking the object header at `address` and its continuation
// chunks (version 1 and version 2 headers). kUnchecked if it is not there (the attribute is in dense storage);
// on kSound, `*data` holds its raw value (`value_size` bytes).
HeapCheck FindAttributeValue(RawFile& raw, const Sizes& s, uint64_t address, const std::string& attr,
                             uint64_t value_size, std::vector<unsigned char>* data) {
  std::vector<unsigned char> prefix;
  if (!raw.Read(address, 16, &prefix)) return HeapCheck::kCorrupt;
  const bool v2 = std::memcmp(prefix.data(), "OHDR", 4) == 0;
  bool creation_order = false;
  std::vector<std::vector<unsigned char>> chunks;
  std::vector<Message> messages;
  struct Pending {  // a continuation chunk still to read
    uint64_t address, length;
  };
  std::vector<Pending> pending;
  uint64_t total = 0;  // bytes of the continuation chunks read
  if (v2) {
    if (prefix[4] != 2) return HeapCheck::kCorrupt;
    const unsigned flags = prefix[5];
    creation_order = (flags & 0x04) != 0;
    const size_t at = 6 + ((flags & 0x20) ? 16 : 0) + ((flags & 0x10) ? 4 : 0);
    const size_t width = size_t{1} << (flags & 0x03);
    std::vector<unsigned char> head;
    if (!raw.Read(address, at + width, &head)) return HeapCheck::kCorrupt;
    const uint64_t chunk0 = LittleEndian(head.data() + at, width);
    if (chunk0 > raw.Left(address + at + width) || raw.Left(address + at + width) - chunk0 < 4)
      return HeapCheck::kCorrupt;
    chunks.emplace_back();
    if (!raw.Read(address, at + width + chunk0, &chunks.back())) return HeapCheck::kCorrupt;
    if (!ParseChunk(chunks.back(), at + width, at + width + chunk0, true, creation_order, &messages))
      return HeapCheck::kCorrupt;
  } else {
    if (prefix[0] != 1) return HeapCheck::kCorrupt;
    const uint64_t chunk0 = LittleEndian(prefix.data() + 8, 4);
    chunks.emplace_back();
    if (!raw.Read(address + 16, chunk0, &chunks.back())) return HeapCheck::kCorrupt;
    if (!ParseChunk(chunks.back(), 0, chunk0, false, false, &messages)) return HeapCheck::kCorrupt;
  }
  for (size_t i = 0;; ++i) {
    while (i == messages.size() && !pending.empty()) {  // every chunk read so far is done: read the next
      const Pending next = pending.back();
      pending.pop_back();
      if (next.length > raw.Left(0) - total) return HeapCheck::kCorrupt;  // more header than file: chunks that loop
      total += next.length;
      chunks.emplace_back();
      if (!raw.Read(next.address, next.length, &chunks.back())) return HeapCheck::kCorrupt;
      const std::vector<unsigned char>& c = chunks.back();
      if (v2) {  // "OCHK", the messages, a 4-byte checksum
        if (c.size() < 8 || std::memcmp(c.data(), "OCHK", 4) != 0) return HeapCheck::kCorrupt;
        if (!ParseChunk(c, 4, c.size() - 4, true, creation_order, &messages)) return HeapCheck::kCorrupt;
      } else if (!ParseChunk(c, 0, c.size(), false, false, &messages)) {
        return HeapCheck::kCorrupt;
      }
    }
    if (i == messages.size()) break;
    const Message m = messages[i];
    if (m.type == kContinuationMessage) {
      if (m.size < s.addr + s.size) return HeapCheck::kCorrupt;
      pending.push_back({LittleEndian(m.data, s.addr), LittleEndian(m.data + s.addr, s.size)});
    } else if (m.type == kAttributeMessage && m.size >= 8) {
      const unsigned version = m.data[0];
      const uint64_t name_size = LittleEndian(m.data + 2, 2), type_size = LittleEndian(m.data + 4, 2);
      const uint64_t space_size = LittleEndian(m.data + 6, 2);
      uint64_t name_at, value_at;
      if (version == 1) {
        name_at = 8;
        value_at = name_at + Pad8(name_size) + Pad8(type_size) + Pad8(space_size);
      } else if (version == 2 || version == 3) {
        name_at = version == 2 ? 8 : 9;
        value_at = name_at + name_size + type_size + space_size;
      } else {
        return HeapCheck::kCorrupt;
      }
      if (name_size == 0 || name_at + name_size > m.size) return HeapCheck::kCorrupt;
      // The stored name counts its terminating null.
      if (name_size != attr.size() + 1 || std::memcmp(m.data + name_at, attr.data(), attr.size()) != 0) continue;
      if (value_at > m.size || value_size > m.size - value_at) return HeapCheck::kCorrupt;
      data->assign(m.data + value_at, m.data + value_at + value_size);
      return HeapCheck::kSound;
    }
  }
  return HeapCheck::kUnchecked;
}

bool ObjectAddress(hid_t file, const std::string& object_path, uint64_t* address) {
#if H5_VERSION_GE(1, 12, 0)
  H5O_info2_t info;
  if (H5Oget_info_by_name3(file, object_path.c_str(), &info, H5O_INFO_BASIC, H5P_DEFAULT) < 0) return false;
  haddr_t addr = HADDR_UNDEF;
  if (H5VLnative_token_to_addr(file, info.token, &addr) < 0 || addr == HADDR_UNDEF) return false;
#else
  H5O_info_t info;
  if (H5Oget_info_by_name2(file, object_path.c_str(), &info, H5O_INFO_BASIC, H5P_DEFAULT) < 0) return false;
  const haddr_t addr = info.addr;
  if (addr == HADDR_UNDEF) return false;
#endif
  *address = addr;
  return true;
}

}  // namespace

HeapCheck CheckDatasetStrings(hid_t file, hid_t ds, const std::string& file_name, size_t n) {
  Handle dcpl(H5Dget_create_plist(ds), H5Pclose);
  const haddr_t offset = H5Dget_offset(ds);
  if (!dcpl.valid() || H5Pget_layout(dcpl.get()) != H5D_CONTIGUOUS || offset == HADDR_UNDEF)
    return HeapCheck::kUnchecked;
  Sizes s;
  if (!FileSizes(file, &s)) return HeapCheck::kCorrupt;
  RawFile raw(file_name, s.userblock);
  std::vector<unsigned char> descs;
  const uint64_t desc = 4 + s.addr + 4;
  if (!raw.ok() || n > raw.Left(offset) / desc || !raw.Read(offset, n * desc, &descs)) return HeapCheck::kCorrupt;
  return CheckDescriptors(raw, s, descs.data(), n);
}

HeapCheck CheckAttributeStrings(hid_t file, const std::string& object_path, const std::string& attr,
                                const std::string& file_name, size_t n) {
  Sizes s;
  uint64_t address = 0;
  if (!FileSizes(file, &s) || !ObjectAddress(file, object_path, &address)) return HeapCheck::kCorrupt;
  RawFile raw(file_name, s.userblock);
  const uint64_t desc = 4 + s.addr + 4;
  if (!raw.ok() || n > raw.Left(0) / desc) return HeapCheck::kCorrupt;
  std::vector<unsigned char> descs;
  const HeapCheck found = FindAttributeValue(raw, s, address, attr, n * desc, &descs);
  if (found != HeapCheck::kSound) return found;
  return CheckDescriptors(raw, s, descs.data(), n);
}

}  // namespace eldr::h5

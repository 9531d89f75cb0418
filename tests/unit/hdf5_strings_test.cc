// h5::File::ReadStrings on well-formed and damaged files: variable-length strings round-trip (UTF-8 included);
// a global-heap object whose size field is corrupted is refused before libhdf5 1.10 reads it (the library
// copies by that size unchecked and crashes: a segfault, no error); strings that are not well-formed UTF-8 are
// refused with the dataset and entry named.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "runtime/common/hdf5.h"

namespace eldr {
namespace {

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("eldr_strings_" + std::to_string(getpid()) + "_" + name)).string();
}

void WriteStringsFile(const std::string& path, const std::vector<std::string>& values) {
  auto f = h5::File::Create(path, path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  ASSERT_TRUE(f->WriteStrings("/s", values).ok());
  ASSERT_TRUE(f->Close().ok());
}

Result<std::vector<std::string>> ReadStringsFile(const std::string& path) {
  auto f = h5::File::OpenReadOnly(path);
  if (!f.ok()) return f.status();
  return f->ReadStrings("/s");
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void Spit(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

TEST(ReadStrings, RoundTripsVariableLengthUtf8AndEmptyStrings) {
  const std::string path = TempPath("ok.h5");
  const std::vector<std::string> values = {"intent-0", "", "€ 5", "\xF0\x9D\x84\x9E clef", std::string(300, 'x')};
  WriteStringsFile(path, values);
  auto got = ReadStringsFile(path);
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(*got, values);
  std::filesystem::remove(path);
}

// The heap object of a string is [index u16, refcount u16, reserved u32, size u64, data]: the 8 bytes before the
// string's data are its size. Setting them to 2^63 - 1 is what crashed `eldr trace stats` (and h5dump).
TEST(ReadStrings, RefusesAHeapObjectSizeOutsideItsCollection) {
  const std::string path = TempPath("heap.h5");
  WriteStringsFile(path, {"first-request", "marker-request-7", "last"});
  std::string bytes = Slurp(path);
  const size_t at = bytes.find("marker-request-7");
  ASSERT_NE(at, std::string::npos);
  ASSERT_GE(at, 8u);
  uint64_t size = 0;
  std::memcpy(&size, bytes.data() + at - 8, 8);
  ASSERT_EQ(size, 16u);  // the layout above, so the test edits the field it means to
  const uint64_t huge = 0x7fffffffffffffffULL;
  std::memcpy(bytes.data() + at - 8, &huge, 8);
  Spit(path, bytes);
  auto got = ReadStringsFile(path);
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("/s"), std::string::npos) << got.status().message();
  EXPECT_NE(got.status().message().find("heap"), std::string::npos) << got.status().message();
  // A size that still fits the collection but is shorter than the string is refused too.
  const uint64_t short_size = 4;
  std::memcpy(bytes.data() + at - 8, &short_size, 8);
  Spit(path, bytes);
  EXPECT_FALSE(ReadStringsFile(path).ok());
  std::filesystem::remove(path);
}

TEST(ReadStrings, RefusesStringsThatAreNotUtf8NamingTheEntry) {
  const std::string path = TempPath("utf8.h5");
  // Each bad case: a lone continuation byte, an overlong '/', a UTF-16 surrogate, past U+10FFFF, a cut sequence.
  for (const std::string bad : {"a\x80", "\xC0\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80", "x\xE2\x82"}) {
    WriteStringsFile(path, {"fine", bad});
    auto got = ReadStringsFile(path);
    ASSERT_FALSE(got.ok()) << "accepted " << bad.size() << " bytes";
    EXPECT_NE(got.status().message().find("/s entry 1 is not valid UTF-8"), std::string::npos)
        << got.status().message();
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace eldr

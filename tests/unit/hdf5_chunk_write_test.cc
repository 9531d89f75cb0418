// h5::File::Write with Filters: chunks shuffled and deflated on worker threads and stored by H5Dwrite_chunk must
// hold exactly the bytes HDF5's own filter pipeline stores for the same data (the library is the oracle: the same
// dataset written by H5Dwrite through the C API), read back through plain H5Dread, for any thread count.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "runtime/common/hdf5.h"

namespace eldr {
namespace {

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("eldr_chunk_write_" + std::to_string(getpid()) + "_" + name))
      .string();
}

// The stored chunks of a dataset: (filter mask, bytes) in chunk order along dimension 0.
struct Stored {
  std::vector<uint32_t> masks;
  std::vector<std::vector<unsigned char>> bytes;
};

Stored ReadStoredChunks(hid_t ds, const h5::Dims& dims, const h5::Dims& chunk) {
  Stored s;
  for (hsize_t row = 0; row < dims[0]; row += chunk[0]) {
    h5::Dims offset(dims.size(), 0);
    offset[0] = row;
    hsize_t size = 0;
    EXPECT_GE(H5Dget_chunk_storage_size(ds, offset.data(), &size), 0);
    std::vector<unsigned char> b(size);
    uint32_t mask = 0;
    EXPECT_GE(H5Dread_chunk(ds, H5P_DEFAULT, offset.data(), &mask, b.data()), 0);
    s.masks.push_back(mask);
    s.bytes.push_back(std::move(b));
  }
  return s;
}

// Writes `data` with File::Write(filters, threads) as /new, then the same data through the library's pipeline
// (same chunk dims and filters, H5Dwrite) as /ref, and compares stored chunks and what H5Dread returns.
template <typename T>
void CheckAgainstLibrary(const std::vector<T>& data, const h5::Dims& dims, const h5::Filters& filters, int threads) {
  const std::string path = TempPath("cmp.h5");
  {
    auto f = h5::File::Create(path, path);
    ASSERT_TRUE(f.ok()) << f.status().message();
    ASSERT_TRUE(f->Write("/new", data, dims, filters, threads).ok());
    ASSERT_TRUE(f->Close().ok());
  }
  hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  hid_t ds_new = H5Dopen2(file, "/new", H5P_DEFAULT);
  hid_t dcpl = H5Dget_create_plist(ds_new);
  ASSERT_EQ(H5Pget_layout(dcpl), H5D_CHUNKED);
  h5::Dims chunk(dims.size());
  ASSERT_EQ(H5Pget_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data()), static_cast<int>(dims.size()));
  EXPECT_EQ(H5Pget_nfilters(dcpl), (filters.shuffle ? 1 : 0) + (filters.deflate_level > 0 ? 1 : 0));
  // The reference: a fresh property list with the same chunk and filters, written by the library.
  hid_t ref_dcpl = H5Pcreate(H5P_DATASET_CREATE);
  ASSERT_GE(H5Pset_chunk(ref_dcpl, static_cast<int>(chunk.size()), chunk.data()), 0);
  if (filters.shuffle) {
    ASSERT_GE(H5Pset_shuffle(ref_dcpl), 0);
  }
  if (filters.deflate_level > 0) {
    ASSERT_GE(H5Pset_deflate(ref_dcpl, filters.deflate_level), 0);
  }
  hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  hid_t type = h5::NativeType<T>();
  hid_t ds_ref = H5Dcreate2(file, "/ref", type, space, H5P_DEFAULT, ref_dcpl, H5P_DEFAULT);
  ASSERT_GE(ds_ref, 0);
  ASSERT_GE(H5Dwrite(ds_ref, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()), 0);
  ASSERT_GE(H5Fflush(file, H5F_SCOPE_LOCAL), 0);

  const Stored got = ReadStoredChunks(ds_new, dims, chunk), want = ReadStoredChunks(ds_ref, dims, chunk);
  ASSERT_EQ(got.bytes.size(), want.bytes.size());
  ASSERT_EQ(got.bytes.size(), (dims[0] + chunk[0] - 1) / chunk[0]);
  for (size_t i = 0; i < got.bytes.size(); ++i) {
    EXPECT_EQ(got.masks[i], want.masks[i]) << "chunk " << i;
    EXPECT_TRUE(got.bytes[i] == want.bytes[i])
        << "chunk " << i << ": " << got.bytes[i].size() << " vs " << want.bytes[i].size() << " bytes";
  }
  std::vector<T> back(data.size());
  ASSERT_GE(H5Dread(ds_new, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, back.data()), 0);
  EXPECT_TRUE(std::memcmp(back.data(), data.data(), data.size() * sizeof(T)) == 0);
  H5Sclose(space);
  H5Pclose(ref_dcpl);
  H5Pclose(dcpl);
  H5Dclose(ds_ref);
  H5Dclose(ds_new);
  H5Fclose(file);
  std::filesystem::remove(path);
}

// Values that compress somewhat, like decode profiles: mostly zero, a few small fractions.
template <typename T>
std::vector<T> Sparse(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> u(0, 9);
  std::vector<T> v(n);
  for (auto& x : v) x = u(rng) < 7 ? T(0) : static_cast<T>(u(rng)) / T(8);
  return v;
}

TEST(ChunkWriteTest, FloatMatrixWithPartialLastChunkMatchesTheLibraryForAnyThreadCount) {
  // Rows of 12 000 bytes: 87 rows per 1 MiB chunk, so 301 rows make 3 full chunks and a partial one of 40 rows.
  const h5::Dims dims{301, 3000};
  const auto data = Sparse<float>(301 * 3000, 1);
  for (int threads : {1, 2, 3, 7}) CheckAgainstLibrary(data, dims, h5::Filters{}, threads);
}

TEST(ChunkWriteTest, ThreeDimensionalDecodeProfileShapeAtOtherLevels) {
  const h5::Dims dims{50, 48, 128};
  const auto data = Sparse<float>(50 * 48 * 128, 2);
  for (int level : {1, 6}) CheckAgainstLibrary(data, dims, h5::Filters{true, level}, 2);
}

TEST(ChunkWriteTest, ShuffleOnlyDeflateOnlyAndOtherElementSizes) {
  CheckAgainstLibrary(Sparse<float>(1000 * 600, 3), {1000, 600}, h5::Filters{true, 0}, 2);
  CheckAgainstLibrary(Sparse<float>(1000 * 600, 4), {1000, 600}, h5::Filters{false, 4}, 2);
  CheckAgainstLibrary(Sparse<double>(200 * 1000, 5), {200, 1000}, h5::Filters{}, 2);
  std::vector<int8_t> bytes(3000 * 500);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<int8_t>((i * 7) % 13);
  CheckAgainstLibrary(bytes, {3000, 500}, h5::Filters{}, 3);
  std::vector<int64_t> small(17);
  for (size_t i = 0; i < small.size(); ++i) small[i] = static_cast<int64_t>(i * i) - 40;
  CheckAgainstLibrary(small, {17}, h5::Filters{}, 2);  // one chunk, smaller than a chunk's bound
}

TEST(ChunkWriteTest, IncompressibleDataMatchesTheLibrary) {
  // Random bits: deflate output is larger than the chunk; the library stores it as it is, and so must the writer.
  std::mt19937_64 rng(9);
  std::vector<uint64_t> data(400 * 700);
  for (auto& x : data) x = rng();
  CheckAgainstLibrary(data, {400, 700}, h5::Filters{}, 2);
  CheckAgainstLibrary(data, {400, 700}, h5::Filters{false, 1}, 2);
}

TEST(ChunkWriteTest, ParallelReadReadsItBack) {
  const std::string path = TempPath("read.h5");
  const auto data = Sparse<float>(301 * 3000, 6);
  {
    auto f = h5::File::Create(path, path);
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE(f->Write("/x", data, {301, 3000}, h5::Filters{true, 1}, 2).ok());
    ASSERT_TRUE(f->Close().ok());
  }
  auto f = h5::File::OpenReadOnly(path);
  ASSERT_TRUE(f.ok());
  h5::Dims dims;
  bool direct = false;
  auto back = f->ReadParallel<float>("/x", &dims, 2, 2, &direct);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_TRUE(direct);
  EXPECT_EQ(dims, (h5::Dims{301, 3000}));
  EXPECT_TRUE(back.value() == data);
  std::filesystem::remove(path);
}

TEST(ChunkWriteTest, NoFiltersWritesContiguous) {
  const std::string path = TempPath("contig.h5");
  const std::vector<int32_t> data{1, 2, 3, 4, 5, 6};
  {
    auto f = h5::File::Create(path, path);
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE(f->Write("/x", data, {2, 3}, h5::Filters{false, 0}, 2).ok());
    EXPECT_FALSE(f->Write("/bad", data, {4, 3}, h5::Filters{}, 2).ok());  // 6 values are not [4, 3]
    ASSERT_TRUE(f->Close().ok());
  }
  hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t ds = H5Dopen2(file, "/x", H5P_DEFAULT);
  hid_t dcpl = H5Dget_create_plist(ds);
  EXPECT_EQ(H5Pget_layout(dcpl), H5D_CONTIGUOUS);
  std::vector<int32_t> back(6);
  ASSERT_GE(H5Dread(ds, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, back.data()), 0);
  EXPECT_EQ(back, data);
  H5Pclose(dcpl);
  H5Dclose(ds);
  H5Fclose(file);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace eldr

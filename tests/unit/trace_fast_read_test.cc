// The direct-chunk trace reader (h5::File::ReadParallel behind ReadTrace) against the plain H5Dread path and
// against the trace that was written: the same ids, weights, prefill counts and decode profiles bit for bit, on
// several chunk layouts (a partial last chunk, one chunk larger than the dataset, single-row chunks), shuffle on
// and off, deflate levels, the legacy writer's storage, and layouts it must leave to the plain read (contiguous,
// chunks splitting a row). The counts come from the signature module (the calibration's own).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "runtime/common/hdf5.h"
#include "runtime/signature/signature.h"
#include "runtime/trace/synth.h"
#include "runtime/trace/trace.h"

namespace eldr {
namespace {

namespace fs = std::filesystem;

class TraceFastReadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("eldr_trace_fast_read_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

// E = 300 > 255, so both bytes of an id vary and the shuffle's second plane matters.
const Trace& Source() {
  static const Trace trace = [] {
    SynthOptions o;
    o.num_domains = 3;
    o.num_requests = 23;
    o.num_layers = 3;
    o.num_experts = 300;
    o.top_k = 5;
    o.prompt_len_min = 1;
    o.prompt_len_max = 40;
    o.output_len_min = 0;
    o.output_len_max = 30;
    o.seed = 11;
    return SynthesizeTrace(o).value();
  }();
  return trace;
}

void ExpectSameFeatures(const Trace& a, const Trace& b) {
  std::vector<int32_t> all(a.requests.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int32_t>(i);
  const RequestFeatures fa = ComputeRequestFeatures(a, all), fb = ComputeRequestFeatures(b, all);
  EXPECT_EQ(fa.prefill_counts, fb.prefill_counts);
  EXPECT_EQ(fa.decode_profile, fb.decode_profile);
  EXPECT_EQ(fa.gate_sums, fb.gate_sums);
  EXPECT_EQ(fa.decode_tokens, fb.decode_tokens);
}

void ExpectSameTrace(const Trace& want, const Trace& got) {
  EXPECT_TRUE(want.shape.SameAs(got.shape));
  EXPECT_EQ(want.topk_ids, got.topk_ids);
  EXPECT_EQ(want.topk_weights, got.topk_weights);
  ASSERT_EQ(want.requests.size(), got.requests.size());
  for (size_t i = 0; i < want.requests.size(); ++i) {
    EXPECT_EQ(want.requests[i].id, got.requests[i].id);
    EXPECT_EQ(want.requests[i].offset, got.requests[i].offset);
    EXPECT_EQ(want.requests[i].prompt_len, got.requests[i].prompt_len);
  }
  ExpectSameFeatures(want, got);
}

// Reads `path` both ways (the direct reader on 1 and 3 threads) and checks each against `want`; `direct` is
// whether ReadParallel must take the direct path for both token datasets.
void ExpectBothReadersGive(const Trace& want, const std::string& path, bool direct) {
  TraceReadOptions plain;
  plain.direct_chunks = false;
  auto p = ReadTrace(path, plain);
  ASSERT_TRUE(p.ok()) << p.status().message();
  ExpectSameTrace(want, p.value());
  for (int threads : {1, 3}) {
    TraceReadOptions fast;
    fast.num_threads = threads;
    auto f = ReadTrace(path, fast);
    ASSERT_TRUE(f.ok()) << f.status().message();
    ExpectSameTrace(want, f.value());
  }
  auto file = h5::File::OpenReadOnly(path);
  ASSERT_TRUE(file.ok());
  bool used = !direct;
  h5::Dims dims;
  ASSERT_TRUE(file->ReadParallel<uint16_t>("/tokens/topk_ids", &dims, 3, 2, &used).ok());
  EXPECT_EQ(used, direct) << path << " /tokens/topk_ids";
  ASSERT_TRUE(file->ReadParallel<float>("/tokens/topk_weights", &dims, 3, 2, &used).ok());
  EXPECT_EQ(used, direct) << path << " /tokens/topk_weights";
}

TEST_F(TraceFastReadTest, SameAsPlainReadOnEveryChunkLayoutAndFilter) {
  const Trace& t = Source();
  const int64_t num_tokens = t.num_tokens_total();
  ASSERT_GT(num_tokens, 300);
  ASSERT_NE(num_tokens % 7, 0);  // the 7-row layout ends in a partial chunk
  struct Layout {
    int64_t chunk_rows;
    bool shuffle;
    int deflate;
  };
  const std::vector<Layout> layouts = {{7, true, 4},          {7, false, 4}, {7, true, 0},
                                       {7, false, 0},         {64, true, 1}, {64, true, 6},
                                       {1, true, 1},          {1, false, 9}, {num_tokens * 2, true, 1},
                                       {num_tokens, false, 6}};
  for (const auto& l : layouts) {
    TraceStorage s;
    s.chunk_rows = l.chunk_rows;
    s.shuffle = l.shuffle;
    s.deflate_level = l.deflate;
    const std::string path = Path("t_" + std::to_string(l.chunk_rows) + "_" + std::to_string(l.shuffle) + "_" +
                                  std::to_string(l.deflate) + ".h5");
    ASSERT_TRUE(WriteTrace(t, path, s).ok());
    SCOPED_TRACE(path);
    ExpectBothReadersGive(t, path, true);
  }
}

TEST_F(TraceFastReadTest, LegacyStorageAndTheNewDefaultsReadTheSame) {
  ASSERT_TRUE(WriteTrace(Source(), Path("legacy.h5"), TraceStorage::Legacy()).ok());
  ExpectBothReadersGive(Source(), Path("legacy.h5"), true);
  ASSERT_TRUE(WriteTrace(Source(), Path("default.h5")).ok());
  ExpectBothReadersGive(Source(), Path("default.h5"), true);
}

// Replaces /tokens/<name> of `path` by a dataset stored as `dcpl` says (H5P_DEFAULT: contiguous).
template <typename T>
void Restore(const std::string& path, const std::string& name, const std::vector<T>& data, hsize_t rows, hsize_t L,
             hsize_t K, hid_t dcpl) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  ASSERT_GE(H5Ldelete(f, name.c_str(), H5P_DEFAULT), 0);
  const hsize_t dims[3] = {rows, L, K};
  hid_t space = H5Screate_simple(3, dims, nullptr);
  hid_t ds = H5Dcreate2(f, name.c_str(), h5::NativeType<T>(), space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  ASSERT_GE(ds, 0);
  ASSERT_GE(H5Dwrite(ds, h5::NativeType<T>(), H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()), 0);
  H5Dclose(ds);
  H5Sclose(space);
  H5Fclose(f);
}

TEST_F(TraceFastReadTest, LayoutsItDoesNotHandleFallBackToThePlainRead) {
  const Trace& t = Source();
  const hsize_t rows = t.num_tokens_total(), L = t.shape.num_layers, K = t.shape.top_k;
  // Contiguous storage (an uncompressed file of another writer).
  ASSERT_TRUE(WriteTrace(t, Path("contiguous.h5")).ok());
  Restore(Path("contiguous.h5"), "/tokens/topk_ids", t.topk_ids, rows, L, K, H5P_DEFAULT);
  Restore(Path("contiguous.h5"), "/tokens/topk_weights", t.topk_weights, rows, L, K, H5P_DEFAULT);
  ExpectBothReadersGive(t, Path("contiguous.h5"), false);
  // Chunks that split a token's row, and a filter pipeline with fletcher32.
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  const hsize_t chunk[3] = {16, 1, K};
  H5Pset_chunk(dcpl, 3, chunk);
  H5Pset_deflate(dcpl, 1);
  ASSERT_TRUE(WriteTrace(t, Path("split.h5")).ok());
  Restore(Path("split.h5"), "/tokens/topk_ids", t.topk_ids, rows, L, K, dcpl);
  Restore(Path("split.h5"), "/tokens/topk_weights", t.topk_weights, rows, L, K, dcpl);
  ExpectBothReadersGive(t, Path("split.h5"), false);
  H5Pclose(dcpl);
  dcpl = H5Pcreate(H5P_DATASET_CREATE);
  const hsize_t whole[3] = {16, L, K};
  H5Pset_chunk(dcpl, 3, whole);
  H5Pset_shuffle(dcpl);
  H5Pset_deflate(dcpl, 1);
  H5Pset_fletcher32(dcpl);
  ASSERT_TRUE(WriteTrace(t, Path("fletcher.h5")).ok());
  Restore(Path("fletcher.h5"), "/tokens/topk_ids", t.topk_ids, rows, L, K, dcpl);
  Restore(Path("fletcher.h5"), "/tokens/topk_weights", t.topk_weights, rows, L, K, dcpl);
  ExpectBothReadersGive(t, Path("fletcher.h5"), false);
  H5Pclose(dcpl);
}

TEST_F(TraceFastReadTest, WeightsAreSkippedWhenNotAsked) {
  ASSERT_TRUE(WriteTrace(Source(), Path("t.h5")).ok());
  TraceReadOptions o;
  o.weights = false;
  auto r = ReadTrace(Path("t.h5"), o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_FALSE(r->has_weights());
  EXPECT_EQ(r->topk_ids, Source().topk_ids);
}

TEST_F(TraceFastReadTest, ACorruptChunkIsAnErrorOnBothPaths) {
  TraceStorage s;
  s.chunk_rows = 64;
  ASSERT_TRUE(WriteTrace(Source(), Path("bad.h5"), s).ok());
  {
    hid_t f = H5Fopen(Path("bad.h5").c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t ds = H5Dopen2(f, "/tokens/topk_ids", H5P_DEFAULT);
    const hsize_t offset[3] = {64, 0, 0};
    const std::vector<unsigned char> junk(100, 0xab);  // not a zlib stream
    ASSERT_GE(H5Dwrite_chunk(ds, H5P_DEFAULT, 0, offset, junk.size(), junk.data()), 0);
    H5Dclose(ds);
    H5Fclose(f);
  }
  for (bool direct : {false, true}) {
    TraceReadOptions o;
    o.direct_chunks = direct;
    auto r = ReadTrace(Path("bad.h5"), o);
    ASSERT_FALSE(r.ok()) << "direct " << direct;
    EXPECT_EQ(r.status().code(), StatusCode::kCorrupt) << r.status().message();
    EXPECT_NE(r.status().message().find("topk_ids"), std::string::npos) << r.status().message();
  }
}

}  // namespace
}  // namespace eldr

// The streaming count of a trace (ReadTraceCounts: TraceStreamReader + h5::File::ReadRowBlocks, counted while the
// chunks inflate) against hand counts and against the plain path: ReadTrace with H5Dread (direct_chunks = false),
// counted by ComputeRequestFeatures, the counting loop calibration used before, kept as the oracle. Traces are
// written with several chunk shapes (one token per chunk, a partial last chunk, one chunk larger than the
// dataset), shuffle on and off, deflate levels 0-9, and with layouts the direct read must leave to HDF5
// (contiguous, chunks splitting a token's row, fletcher32); bad ids and corrupt chunks fail as ReadTrace fails.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <mutex>

#include "runtime/common/hdf5.h"
#include "runtime/signature/signature.h"
#include "runtime/trace/synth.h"
#include "runtime/trace/trace.h"
#include "runtime/trace/trace_store.h"

namespace eldr {
namespace {

namespace fs = std::filesystem;

class TraceCountsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("eldr_trace_counts_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

// E = 300 > 255 (both bytes of an id vary under shuffle); lengths 1-40 prompt and 0-30 decode tokens, so requests
// with no decode tokens occur and most requests straddle a 7-token chunk.
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

std::vector<int32_t> AllRequests(size_t n) {
  std::vector<int32_t> all(n);
  for (size_t i = 0; i < n; ++i) all[i] = static_cast<int32_t>(i);
  return all;
}

// The counts of `path` read the plain way (H5Dread) and counted by ComputeRequestFeatures; `got` must match them bit
// for bit, through FeaturesFromCounts.
void ExpectSameAsPlainRead(const std::string& path, const TraceCounts& got) {
  TraceReadOptions plain;
  plain.direct_chunks = false;
  plain.weights = got.has_weights;
  auto t = ReadTrace(path, plain);
  ASSERT_TRUE(t.ok()) << t.status().message();
  const std::vector<int32_t> all = AllRequests(t->requests.size());
  const RequestFeatures want = ComputeRequestFeatures(t.value(), all);
  const RequestFeatures f = FeaturesFromCounts(got, all);
  EXPECT_EQ(f.prefill_counts, want.prefill_counts);
  EXPECT_EQ(f.decode_profile, want.decode_profile);
  EXPECT_EQ(f.decode_tokens, want.decode_tokens);
  EXPECT_EQ(f.gate_sums, want.gate_sums);
  ASSERT_EQ(got.requests.size(), t->requests.size());
  for (size_t i = 0; i < got.requests.size(); ++i) {
    EXPECT_EQ(got.requests[i].id, t->requests[i].id);
    EXPECT_EQ(got.requests[i].domain, t->requests[i].domain);
    EXPECT_EQ(got.requests[i].offset, t->requests[i].offset);
  }
  // The decode counts are whole numbers summing to decode tokens × k per layer.
  const int L = got.shape.num_layers, E = got.shape.num_experts, K = got.shape.top_k;
  for (size_t i = 0; i < got.requests.size(); ++i) {
    for (int l = 0; l < L; ++l) {
      double sum = 0;
      for (int e = 0; e < E; ++e) sum += got.decode_counts[(i * L + l) * E + e];
      EXPECT_EQ(sum, static_cast<double>(got.requests[i].decode_len() * K)) << "request " << i << " layer " << l;
    }
  }
}

// Streams `path` on 1 and 3 threads, direct and plain, and checks each against the plain read.
void ExpectStreamedCountsMatch(const std::string& path) {
  for (bool direct : {true, false}) {
    for (int threads : {1, 3}) {
      SCOPED_TRACE(path + " direct " + std::to_string(direct) + " threads " + std::to_string(threads));
      TraceReadOptions o;
      o.weights = false;
      o.direct_chunks = direct;
      o.num_threads = threads;
      auto c = ReadTraceCounts(path, o);
      ASSERT_TRUE(c.ok()) << c.status().message();
      EXPECT_FALSE(c->has_weights);
      EXPECT_TRUE(c->gate_sums.empty());
      ExpectSameAsPlainRead(path, c.value());
    }
  }
}

// Whether ReadRowBlocks took the direct path on `path`'s ids, and that its blocks tile the rows exactly once with
// the rows H5Dread gives.
bool ExpectBlocksTileTheIds(const std::string& path) {
  auto f = h5::File::OpenReadOnly(path);
  EXPECT_TRUE(f.ok());
  h5::Dims dims;
  auto all = f->Read<uint16_t>("/tokens/topk_ids", &dims, 3);
  EXPECT_TRUE(all.ok());
  const size_t row = dims[1] * dims[2];
  std::vector<int> seen(dims[0], 0);
  std::vector<uint16_t> got(all->size(), 0);
  std::mutex mu;
  bool direct = false;
  h5::Dims got_dims;
  const Status st = f->ReadRowBlocks<uint16_t>(
      "/tokens/topk_ids", 3, 3,
      [&](hsize_t first, hsize_t n, const uint16_t* rows, int worker) {
        EXPECT_GE(worker, 0);
        EXPECT_LT(worker, 3);
        std::lock_guard<std::mutex> lock(mu);
        for (hsize_t i = 0; i < n; ++i) ++seen[first + i];
        std::copy_n(rows, n * row, got.data() + first * row);
      },
      &got_dims, &direct);
  EXPECT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(got_dims, dims);
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), static_cast<long>(dims[0])) << "every row exactly once";
  EXPECT_EQ(got, all.value());
  return direct;
}

TEST_F(TraceCountsTest, HandCountsWithRequestsSplitOverChunks) {
  // L = 2, E = 4, k = 2. Request a: prompt {0,1|2,3}, {0,2|1,3}; decode {0,1|0,1}. Request b: prompt {3,2|0,1};
  // decode {1,2|2,3}, {1,0|3,2}. Chunks of 2 tokens split a's decode token from its prompt and b in two.
  Trace t;
  t.shape = {"hand", 2, 4, 2};
  t.requests = {{"a", "x", 2, 3, 0}, {"b", "y", 1, 3, 3}};
  t.topk_ids = {0, 1, 2, 3, 0, 2, 1, 3, 0, 1, 0, 1, 3, 2, 0, 1, 1, 2, 2, 3, 1, 0, 3, 2};
  const std::vector<float> prefill_a = {2, 1, 1, 0, 0, 1, 1, 2}, decode_a = {1, 1, 0, 0, 1, 1, 0, 0};
  const std::vector<float> prefill_b = {0, 0, 1, 1, 1, 1, 0, 0}, decode_b = {1, 2, 1, 0, 0, 0, 2, 2};
  for (int64_t chunk_rows : {1, 2, 4, 100}) {
    TraceStorage s;
    s.chunk_rows = chunk_rows;
    const std::string path = Path("hand_" + std::to_string(chunk_rows) + ".h5");
    ASSERT_TRUE(WriteTrace(t, path, s).ok());
    for (int threads : {1, 2, 4}) {
      TraceReadOptions o;
      o.weights = false;
      o.num_threads = threads;
      auto c = ReadTraceCounts(path, o);
      ASSERT_TRUE(c.ok()) << c.status().message();
      std::vector<float> prefill = prefill_a, decode = decode_a;
      prefill.insert(prefill.end(), prefill_b.begin(), prefill_b.end());
      decode.insert(decode.end(), decode_b.begin(), decode_b.end());
      EXPECT_EQ(c->prefill_counts, prefill) << "chunk rows " << chunk_rows << " threads " << threads;
      EXPECT_EQ(c->decode_counts, decode) << "chunk rows " << chunk_rows << " threads " << threads;
      const RequestFeatures f = FeaturesFromCounts(c.value(), {1});
      EXPECT_EQ(f.decode_profile, (std::vector<float>{0.5f, 1, 0.5f, 0, 0, 0, 1, 1}));
      EXPECT_EQ(f.decode_tokens, (std::vector<int64_t>{2}));
    }
  }
}

TEST_F(TraceCountsTest, SameAsPlainReadOnEveryChunkLayoutAndFilter) {
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
                                       {7, false, 0},         {64, true, 1}, {64, false, 9},
                                       {1, true, 1},          {1, false, 6}, {num_tokens * 2, true, 1},
                                       {num_tokens, false, 6}};
  for (const auto& l : layouts) {
    TraceStorage s;
    s.chunk_rows = l.chunk_rows;
    s.shuffle = l.shuffle;
    s.deflate_level = l.deflate;
    const std::string path = Path("t_" + std::to_string(l.chunk_rows) + "_" + std::to_string(l.shuffle) + "_" +
                                  std::to_string(l.deflate) + ".h5");
    ASSERT_TRUE(WriteTrace(t, path, s).ok());
    ExpectStreamedCountsMatch(path);
    EXPECT_TRUE(ExpectBlocksTileTheIds(path)) << path << ": the direct path";
  }
  ASSERT_TRUE(WriteTrace(t, Path("legacy.h5"), TraceStorage::Legacy()).ok());
  ExpectStreamedCountsMatch(Path("legacy.h5"));
  ASSERT_TRUE(WriteTrace(t, Path("default.h5")).ok());
  ExpectStreamedCountsMatch(Path("default.h5"));
}

// Replaces /tokens/topk_ids of `path` by a dataset stored as `dcpl` says (H5P_DEFAULT: contiguous).
void RestoreIds(const std::string& path, const Trace& t, hid_t dcpl) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  ASSERT_GE(H5Ldelete(f, "/tokens/topk_ids", H5P_DEFAULT), 0);
  const hsize_t dims[3] = {static_cast<hsize_t>(t.num_tokens_total()), static_cast<hsize_t>(t.shape.num_layers),
                           static_cast<hsize_t>(t.shape.top_k)};
  hid_t space = H5Screate_simple(3, dims, nullptr);
  hid_t ds = H5Dcreate2(f, "/tokens/topk_ids", H5T_NATIVE_UINT16, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  ASSERT_GE(ds, 0);
  ASSERT_GE(H5Dwrite(ds, H5T_NATIVE_UINT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.topk_ids.data()), 0);
  H5Dclose(ds);
  H5Sclose(space);
  H5Fclose(f);
}

TEST_F(TraceCountsTest, LayoutsTheDirectReadDoesNotTakeFallBackToHdf5) {
  const Trace& t = Source();
  const hsize_t L = t.shape.num_layers, K = t.shape.top_k;
  ASSERT_TRUE(WriteTrace(t, Path("contiguous.h5")).ok());
  RestoreIds(Path("contiguous.h5"), t, H5P_DEFAULT);
  hid_t split = H5Pcreate(H5P_DATASET_CREATE);
  const hsize_t split_chunk[3] = {16, 1, K};
  H5Pset_chunk(split, 3, split_chunk);
  H5Pset_deflate(split, 1);
  ASSERT_TRUE(WriteTrace(t, Path("split.h5")).ok());
  RestoreIds(Path("split.h5"), t, split);
  H5Pclose(split);
  hid_t fletcher = H5Pcreate(H5P_DATASET_CREATE);
  const hsize_t whole[3] = {16, L, K};
  H5Pset_chunk(fletcher, 3, whole);
  H5Pset_shuffle(fletcher);
  H5Pset_deflate(fletcher, 1);
  H5Pset_fletcher32(fletcher);
  ASSERT_TRUE(WriteTrace(t, Path("fletcher.h5")).ok());
  RestoreIds(Path("fletcher.h5"), t, fletcher);
  H5Pclose(fletcher);
  for (const char* name : {"contiguous.h5", "split.h5", "fletcher.h5"}) {
    ExpectStreamedCountsMatch(Path(name));
    EXPECT_FALSE(ExpectBlocksTileTheIds(Path(name))) << name << ": HDF5's own read";
  }
}

TEST_F(TraceCountsTest, WeightsReadOnlyWhenAskedAndThenCountedLikeTheWholeTrace) {
  ASSERT_TRUE(WriteTrace(Source(), Path("t.h5")).ok());
  TraceReadOptions o;
  o.weights = true;
  auto c = ReadTraceCounts(Path("t.h5"), o);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_TRUE(c->has_weights);
  ExpectSameAsPlainRead(Path("t.h5"), c.value());
  o.weights = false;
  auto ids_only = ReadTraceCounts(Path("t.h5"), o);
  ASSERT_TRUE(ids_only.ok());
  EXPECT_EQ(ids_only->prefill_counts, c->prefill_counts);
  EXPECT_EQ(ids_only->decode_counts, c->decode_counts);
}

// Overwrites id j of token `token` at layer 0 of `path`'s ids (through HDF5's filters).
void PokeId(const std::string& path, hsize_t token, hsize_t j, uint16_t value) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  hid_t ds = H5Dopen2(f, "/tokens/topk_ids", H5P_DEFAULT);
  hid_t fspace = H5Dget_space(ds);
  const hsize_t start[3] = {token, 0, j}, count[3] = {1, 1, 1};
  H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, nullptr, count, nullptr);
  hid_t mspace = H5Screate_simple(3, count, nullptr);
  ASSERT_GE(H5Dwrite(ds, H5T_NATIVE_UINT16, mspace, fspace, H5P_DEFAULT, &value), 0);
  H5Sclose(mspace);
  H5Sclose(fspace);
  H5Dclose(ds);
  H5Fclose(f);
}

TEST_F(TraceCountsTest, BadIdsFailWithReadTracesMessage) {
  const Trace& t = Source();
  TraceStorage s;
  s.chunk_rows = 7;
  struct Case {
    const char* name;
    hsize_t token, j;
    uint16_t value;  // id 300 >= E; or the id of slot 0 again (repeated within top-k)
  };
  for (const Case& c : {Case{"range", 100, 2, 300}, Case{"repeat", 200, 3, t.topk_ids[200 * 15 + 0]}}) {
    const std::string path = Path(std::string(c.name) + ".h5");
    ASSERT_TRUE(WriteTrace(t, path, s).ok());
    PokeId(path, c.token, c.j, c.value);
    PokeId(path, c.token + 50, c.j, c.value == 300 ? 301 : t.topk_ids[(c.token + 50) * 15]);  // a later bad one
    auto whole = ReadTrace(path);
    ASSERT_FALSE(whole.ok());
    EXPECT_NE(whole.status().message().find("token " + std::to_string(c.token) + " layer 0"), std::string::npos)
        << whole.status().message();
    for (bool direct : {true, false}) {
      for (int threads : {1, 3}) {
        TraceReadOptions o;
        o.weights = false;
        o.direct_chunks = direct;
        o.num_threads = threads;
        auto r = ReadTraceCounts(path, o);
        ASSERT_FALSE(r.ok());
        EXPECT_EQ(r.status().code(), StatusCode::kCorrupt);
        EXPECT_EQ(r.status().message(), whole.status().message()) << "direct " << direct << " threads " << threads;
      }
    }
  }
}

TEST_F(TraceCountsTest, ACorruptChunkOrBadRequestTableIsAnError) {
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
    o.weights = false;
    o.direct_chunks = direct;
    auto r = ReadTraceCounts(Path("bad.h5"), o);
    ASSERT_FALSE(r.ok()) << "direct " << direct;
    EXPECT_EQ(r.status().code(), StatusCode::kCorrupt) << r.status().message();
    EXPECT_NE(r.status().message().find("topk_ids"), std::string::npos) << r.status().message();
  }
  // Offsets that do not cover the ids: refused before any token is read, with ReadTrace's message.
  ASSERT_TRUE(WriteTrace(Source(), Path("offsets.h5")).ok());
  {
    auto f = h5::File::OpenReadWrite(Path("offsets.h5"), "offsets.h5");
    ASSERT_TRUE(f.ok());
    std::vector<int64_t> num_tokens;
    for (const auto& r : Source().requests) num_tokens.push_back(r.num_tokens);
    num_tokens.back() -= 1;
    ASSERT_TRUE(f->Remove("/requests/num_tokens").ok());
    ASSERT_TRUE(f->Write("/requests/num_tokens", num_tokens, {num_tokens.size()}).ok());
    ASSERT_TRUE(f->Close().ok());
  }
  auto whole = ReadTrace(Path("offsets.h5"));
  ASSERT_FALSE(whole.ok());
  TraceReadOptions o;
  o.weights = false;
  auto r = ReadTraceCounts(Path("offsets.h5"), o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), whole.status().message());
  EXPECT_EQ(ReadTraceCounts(Path("missing.h5"), o).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace eldr

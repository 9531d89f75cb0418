// JSONL import and the HDF5 trace store: round trip against the JSON content, every validation rule
// with its line number, and no output file on failure.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <thread>

#include "runtime/trace/trace.h"

namespace eldr {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class TraceIoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("eldr_trace_io_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  std::string WriteLines(const std::vector<std::string>& lines) {
    std::string p = Path("in.jsonl");
    std::ofstream f(p);
    for (const auto& l : lines) f << l << "\n";
    return p;
  }
  // The directory holds nothing but the input (no output, no temporary).
  void ExpectNoOutput() {
    for (const auto& e : fs::directory_iterator(dir_)) {
      EXPECT_EQ(e.path().filename().string(), "in.jsonl") << "stray file " << e.path();
    }
  }
  fs::path dir_;
};

json Request(const std::string& id, int prompt_len, std::vector<std::vector<std::vector<int>>> ids) {
  json j;
  j["id"] = id;
  j["domain"] = "law";
  j["num_layers"] = ids.empty() ? 0 : static_cast<int>(ids[0].size());
  j["num_experts"] = 8;
  j["top_k"] = ids.empty() ? 0 : static_cast<int>(ids[0][0].size());
  j["num_tokens"] = static_cast<int>(ids.size());
  j["prompt_len"] = prompt_len;
  j["topk_ids"] = ids;
  return j;
}

TEST_F(TraceIoTest, RoundTripPlainAndGzip) {
  json a = Request("a", 1, {{{1, 2}, {3, 4}}, {{5, 6}, {7, 0}}});
  a["topk_weights"] = {{{0.6, 0.4}, {0.5, 0.5}}, {{0.9, 0.1}, {0.3, 0.2}}};
  json b = Request("b", 2, {{{0, 7}, {1, 2}}, {{2, 3}, {4, 5}}, {{6, 1}, {0, 3}}});
  b["topk_weights"] = {{{1, 0}, {1, 0}}, {{1, 0}, {1, 0}}, {{1, 0}, {1, 0}}};
  b.erase("domain");
  const std::string in = WriteLines({a.dump(), "", b.dump()});
  for (bool gz : {false, true}) {
    std::string src = in;
    if (gz) {
      src = Path("in.jsonl.gz");
      gzFile g = gzopen(src.c_str(), "wb");
      std::ifstream f(in);
      std::string all((std::istreambuf_iterator<char>(f)), {});
      gzwrite(g, all.data(), static_cast<unsigned>(all.size()));
      gzclose(g);
    }
    const std::string out = Path(gz ? "gz.h5" : "plain.h5");
    ImportSummary s;
    ASSERT_TRUE(ImportJsonlTrace(src, out, &s).ok());
    EXPECT_EQ(s.num_requests, 2);
    EXPECT_EQ(s.num_tokens, 5);
    auto t = ReadTrace(out);
    ASSERT_TRUE(t.ok()) << t.status().message();
    EXPECT_EQ(t->shape.num_layers, 2);
    EXPECT_EQ(t->shape.num_experts, 8);
    EXPECT_EQ(t->shape.top_k, 2);
    ASSERT_EQ(t->requests.size(), 2u);
    EXPECT_EQ(t->requests[0].domain, "law");
    EXPECT_EQ(t->requests[1].domain, "");
    EXPECT_EQ(t->requests[1].offset, 2);
    EXPECT_EQ(t->requests[1].prompt_len, 2);
    // Token 3 (request b, token 1), layer 1 = {4, 5}.
    EXPECT_EQ(t->token_ids(3)[2], 4);
    EXPECT_EQ(t->token_ids(3)[3], 5);
    EXPECT_FLOAT_EQ(t->token_weights(1)[3], 0.2f);
  }
}

struct BadCase {
  std::string name;
  std::function<void(json&)> mutate;
  std::string expect;  // substring of the error
};

TEST_F(TraceIoTest, EveryBadLineIsReportedWithItsNumberAndLeavesNoFile) {
  const json good = Request("g", 1, {{{1, 2}}, {{3, 4}}});
  std::vector<BadCase> cases = {
      {"expert id too large", [](json& j) { j["topk_ids"][0][0][1] = 8; }, "outside [0, num_experts = 8)"},
      {"negative id", [](json& j) { j["topk_ids"][1][0][0] = -1; }, "outside"},
      {"repeated id",
       [](json& j) {
         j["topk_ids"][0][0] = {5, 5};
       },
       "repeats expert 5"},
      {"wrong k",
       [](json& j) {
         j["topk_ids"][0][0] = {1, 2, 3};
       },
       "must have top_k = 2"},
      {"wrong layers",
       [](json& j) {
         j["topk_ids"][0] = {{1, 2}, {3, 4}};
       },
       "num_layers = 1"},
      {"wrong token count", [](json& j) { j["num_tokens"] = 3; }, "num_tokens = 3"},
      {"prompt_len > num_tokens", [](json& j) { j["prompt_len"] = 3; }, "prompt_len 3"},
      {"negative prompt_len", [](json& j) { j["prompt_len"] = -1; }, "prompt_len -1"},
      {"missing field", [](json& j) { j.erase("top_k"); }, "missing field 'top_k'"},
      {"empty domain", [](json& j) { j["domain"] = ""; }, "empty string"},
      {"NaN weight",
       [](json& j) {
         j["topk_weights"] = {{{0.5, -0.1}}, {{0.5, 0.5}}};
       },
       "negative or non-finite"},
      {"shape differs", [](json& j) { j["num_experts"] = 16; }, "differs from the first request"},
      {"duplicate id", [](json& j) { j["id"] = "g"; }, "duplicate request id"},
      {"unknown field", [](json& j) { j["topk_weight"] = j["topk_ids"]; },
       "unknown field 'topk_weight' (did you mean 'topk_weights'?); a record's fields are id, domain, model"},
  };
  for (const auto& c : cases) {
    json bad = good;
    bad["id"] = "x";
    c.mutate(bad);
    const std::string in = WriteLines({good.dump(), bad.dump()});
    const std::string out = Path("out.h5");
    Status st = ImportJsonlTrace(in, out, nullptr);
    ASSERT_FALSE(st.ok()) << c.name;
    EXPECT_NE(st.message().find(in + ":2: "), std::string::npos) << c.name << ": " << st.message();
    EXPECT_NE(st.message().find(c.expect), std::string::npos) << c.name << ": " << st.message();
    EXPECT_FALSE(fs::exists(out)) << c.name;
    ExpectNoOutput();
  }
  // Not JSON at all, on line 3.
  const std::string in = WriteLines({good.dump(), "", "{not json"});
  Status st = ImportJsonlTrace(in, Path("out.h5"), nullptr);
  EXPECT_NE(st.message().find(":3: not valid JSON"), std::string::npos) << st.message();
  ExpectNoOutput();
  // Empty file.
  WriteLines({});
  EXPECT_NE(ImportJsonlTrace(Path("in.jsonl"), Path("out.h5"), nullptr).message().find("no requests"),
            std::string::npos);
  ExpectNoOutput();
}

TEST_F(TraceIoTest, MissingTruncatedAndCorruptFiles) {
  EXPECT_EQ(ReadTrace(Path("missing.h5")).status().code(), StatusCode::kNotFound);
  // Corrupt: random bytes.
  {
    std::ofstream f(Path("corrupt.h5"), std::ios::binary);
    for (int i = 0; i < 4096; ++i) f.put(static_cast<char>(i * 31));
  }
  auto c = ReadTrace(Path("corrupt.h5"));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("corrupt.h5"), std::string::npos);
  // Truncated: a valid trace cut in half.
  const json good = Request("g", 1, {{{1, 2}}, {{3, 4}}});
  const std::string in = WriteLines({good.dump()});
  ASSERT_TRUE(ImportJsonlTrace(in, Path("ok.h5"), nullptr).ok());
  ASSERT_TRUE(ReadTrace(Path("ok.h5")).ok());
  const auto size = fs::file_size(Path("ok.h5"));
  fs::copy_file(Path("ok.h5"), Path("cut.h5"));
  fs::resize_file(Path("cut.h5"), size / 2);
  auto t = ReadTrace(Path("cut.h5"));
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("cut.h5"), std::string::npos);
  // Unwritable output directory.
  Status st = ImportJsonlTrace(in, Path("no/such/dir/out.h5"), nullptr);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("does not exist"), std::string::npos) << st.message();
}

// `text` deflated by zlib: window_bits 15 + 16 wraps it in a gzip member, -15 gives raw deflate data; flush
// Z_FINISH ends the stream, Z_SYNC_FLUSH stops at a byte boundary without an end. Written by hand so that the test
// controls every byte: a member cut short, bytes after it, a second member.
std::string Deflate(const std::string& text, int window_bits, int flush) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, 6, Z_DEFLATED, window_bits, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&z, text.size()) + 64, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  z.avail_in = static_cast<uInt>(text.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&z, flush), flush == Z_FINISH ? Z_STREAM_END : Z_OK);
  out.resize(out.size() - z.avail_out);
  deflateEnd(&z);
  return out;
}

// One gzip member of `text`.
std::string GzipMember(const std::string& text) { return Deflate(text, 15 + 16, Z_FINISH); }

// The raw deflate data of the first half of `text`, with no end and no trailer: appended to a gzip header, a member
// cut inside its text.
std::string RawDeflatePrefix(const std::string& text) {
  return Deflate(text.substr(0, text.size() / 2), -15, Z_SYNC_FLUSH);
}

// The gzip framing, read once from a regular file and from a FIFO (a pipe cannot be read twice): concatenated
// members are one stream; bytes after the last member are refused with their count; a member cut short is
// reported as truncated with the line it cut; damaged data as damaged. Each error leaves no output.
TEST_F(TraceIoTest, GzipMembersTrailingBytesAndCutsFromAFileAndAPipe) {
  const std::string a = Request("a", 1, {{{1, 2}}, {{3, 4}}}).dump() + "\n";
  const std::string b = Request("b", 1, {{{5, 6}}, {{7, 0}}}).dump() + "\n";
  const std::string ab = GzipMember(a) + GzipMember(b);
  std::string damaged = GzipMember(a + b);
  damaged[damaged.size() / 2] ^= 0x55;
  damaged[damaged.size() / 2 + 1] ^= 0x55;
  struct Case {
    std::string name, bytes, error;  // error: "" = imports both requests
  };
  const std::vector<Case> cases = {
      {"two members", ab, ""},
      {"plain lines after a member", GzipMember(a) + b,
       std::to_string(b.size()) + " bytes after the end of the gzip stream"},
      {"one stray byte", ab + "x", ": 1 byte after the end of the gzip stream are not gzip data"},
      {"a member cut short before its text", ab.substr(0, GzipMember(a).size() + 12),
       ".gz: the gzip stream ends early after line 1 (the file is truncated)"},
      {"a member cut short inside a line", GzipMember(a) + GzipMember(b).substr(0, 10) + RawDeflatePrefix(b),
       ".gz:2: the gzip stream ends early (the file is truncated)"},
      {"a trailer cut short (no line cut)", ab.substr(0, ab.size() - 5),
       ".gz: the gzip stream ends early after line 2"},
      {"zero padding after the last member (a block device's)", ab + std::string(100, '\0'), ""},
      {"damaged data", damaged, "the gzip data is damaged"},
  };
  for (bool fifo : {false, true}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(c.name + (fifo ? " (FIFO)" : " (file)"));
      const std::string in = Path("in.jsonl.gz"), out = Path("out.h5");
      fs::remove(in);
      fs::remove(out);
      std::thread writer;
      if (fifo) {
        ASSERT_EQ(::mkfifo(in.c_str(), 0600), 0);
        writer = std::thread([&] {
          std::ofstream f(in, std::ios::binary);  // blocks until the import opens the FIFO
          f.write(c.bytes.data(), static_cast<std::streamsize>(c.bytes.size()));
        });
      } else {
        std::ofstream(in, std::ios::binary).write(c.bytes.data(), static_cast<std::streamsize>(c.bytes.size()));
      }
      ImportSummary summary;
      const Status st = ImportJsonlTrace(in, out, &summary);
      if (writer.joinable()) writer.join();
      if (c.error.empty()) {
        ASSERT_TRUE(st.ok()) << st.message();
        EXPECT_EQ(summary.num_requests, 2);
      } else {
        ASSERT_FALSE(st.ok());
        EXPECT_NE(st.message().find(in), std::string::npos) << st.message();
        EXPECT_NE(st.message().find(c.error), std::string::npos) << st.message();
        EXPECT_FALSE(fs::exists(out));
      }
    }
  }
}

TEST_F(TraceIoTest, WriteTraceRejectsInvalidTraces) {
  Trace t;
  t.shape = {"m", 1, 4, 2};
  t.requests.push_back({"a", "", 1, 1, 0});
  t.topk_ids = {1, 1};  // repeated id
  Status st = WriteTrace(t, Path("t.h5"));
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("repeated"), std::string::npos);
  EXPECT_FALSE(fs::exists(Path("t.h5")));
}

}  // namespace
}  // namespace eldr

// HDF5 write errors are Status values (issue 14): a file-size limit (RLIMIT_FSIZE, with SIGXFSZ ignored) makes
// every write() past N bytes fail with EFBIG, the way a full disk fails with ENOSPC. The writers must report the
// first failure naming the file and the reason, close their handles without crashing (also at exit), and leave
// no temporary. Each test runs in its own process under ctest, so a limit never leaks into another test.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <random>

#include "runtime/common/hdf5.h"
#include "runtime/trace/synth.h"
#include "runtime/trace/trace.h"

namespace eldr {
namespace {

namespace fs = std::filesystem;

// Limits the size of files this process writes to `bytes` while in scope.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    std::signal(SIGXFSZ, SIG_IGN);
    getrlimit(RLIMIT_FSIZE, &saved_);
    rlimit r = saved_;
    r.rlim_cur = bytes;
    EXPECT_EQ(setrlimit(RLIMIT_FSIZE, &r), 0);
  }
  ~FileSizeLimit() { setrlimit(RLIMIT_FSIZE, &saved_); }

 private:
  rlimit saved_{};
};

class Hdf5WriteErrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("eldr_h5err_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  bool Empty() const { return fs::directory_iterator(dir_) == fs::directory_iterator(); }

  fs::path dir_;
};

std::vector<float> Noise(size_t n) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(0, 1);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

TEST_F(Hdf5WriteErrorTest, CompressedDatasetWhoseChunksOnlyFailAtCloseIsAnError) {
  // The chunk cache holds the data after H5Dwrite; only the dataset's close writes it. That close used to be
  // unchecked, so the file looked complete.
  FileSizeLimit limit(16 << 10);
  auto f = h5::File::Create(Path("x.h5"), "x.h5");
  ASSERT_TRUE(f.ok()) << f.status().message();
  const std::vector<float> data = Noise(1 << 18);
  Status st = f->Write("/g/data", data, {data.size()}, true);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message().rfind("x.h5: cannot write dataset /g/data: ", 0), 0u) << st.message();
  EXPECT_NE(st.message().find("File too large"), std::string::npos) << st.message();
  EXPECT_FALSE(f->Close().ok());  // the close reports too, and does not crash
}

TEST_F(Hdf5WriteErrorTest, TraceWriterReportsTheFileAndLeavesNoTemporary) {
  SynthOptions o;
  o.num_requests = 200;
  o.num_layers = 8;
  o.num_experts = 32;
  o.top_k = 4;
  o.prompt_len_min = o.prompt_len_max = 32;
  o.output_len_min = o.output_len_max = 32;
  auto t = SynthesizeTrace(o);
  ASSERT_TRUE(t.ok()) << t.status().message();
  for (rlim_t bytes : {rlim_t{0}, rlim_t{2048}, rlim_t{64 << 10}}) {  // at create, at the first chunk, later
    FileSizeLimit limit(bytes);
    Status st = WriteTrace(t.value(), Path("t.h5"));
    ASSERT_FALSE(st.ok()) << bytes;
    EXPECT_EQ(st.message().rfind(Path("t.h5") + ": ", 0), 0u) << st.message();
    EXPECT_NE(st.message().find("File too large"), std::string::npos) << st.message();
    EXPECT_TRUE(Empty()) << "temporary left after a failure at " << bytes << " bytes";
  }
  // Without the limit the same trace is written and reads back.
  ASSERT_TRUE(WriteTrace(t.value(), Path("t.h5")).ok());
  auto back = ReadTrace(Path("t.h5"));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->topk_ids, t->topk_ids);
}

}  // namespace
}  // namespace eldr

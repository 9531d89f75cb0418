// The run directory (job/metrics.h CommitRunDirectory): all or none, refused or replaced whole, never mixed.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "runtime/job/metrics.h"

namespace eldr {
namespace {

namespace fs = std::filesystem;

class RunDirectoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("eldr-rundir-" + std::to_string(::getpid()) + "-" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
    dir_ = (root_ / "run").string();
  }
  void TearDown() override { fs::remove_all(root_); }

  static std::string Read(const fs::path& p) {
    std::ifstream in(p);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  static void Put(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }
  // Every name in `d` (files and directories).
  static std::set<std::string> Names(const fs::path& d) {
    std::set<std::string> names;
    for (const auto& e : fs::directory_iterator(d)) names.insert(e.path().filename().string());
    return names;
  }

  fs::path root_;
  std::string dir_;
};

// A run's metrics.json names eldr_version (provenance.h): what output.replace recognises an earlier run by.
const std::string kMetrics1 = "{\"eldr_version\": \"t\", \"run\": 1}\n";
const std::string kMetrics2 = "{\"eldr_version\": \"t\", \"run\": 2}\n";
const std::vector<std::pair<std::string, std::string>> kRun2 = {{"requests.jsonl", "r2\n"},
                                                                {"metrics.json", kMetrics2}};

TEST_F(RunDirectoryTest, NewDirectoryGetsEveryFileAndNoTemporaryIsLeft) {
  ASSERT_TRUE(
      CommitRunDirectory(dir_, false, {{"requests.jsonl", "r\n"}, {"steps.jsonl", "s\n"}, {"metrics.json", "m\n"}})
          .ok());
  EXPECT_EQ(Names(dir_), (std::set<std::string>{"metrics.json", "requests.jsonl", "steps.jsonl"}));
  EXPECT_EQ(Read(fs::path(dir_) / "steps.jsonl"), "s\n");
  EXPECT_EQ(Names(root_), std::set<std::string>{"run"});  // no .run.tmp.PID beside it
}

TEST_F(RunDirectoryTest, EmptyDirectoryIsUsed) {
  fs::create_directories(dir_);
  ASSERT_TRUE(CommitRunDirectory(dir_, false, kRun2).ok());
  EXPECT_EQ(Read(fs::path(dir_) / "metrics.json"), kMetrics2);
}

TEST_F(RunDirectoryTest, EarlierRunIsRefusedWithoutReplaceAndLeftAsItWas) {
  fs::create_directories(dir_);
  Put(fs::path(dir_) / "metrics.json", "m1\n");
  for (const Status& st : {CheckRunDirectory(dir_, false), CommitRunDirectory(dir_, false, kRun2)}) {
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("output.dir " + dir_ + " already holds files"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("output.replace: true"), std::string::npos) << st.message();
  }
  EXPECT_EQ(Names(dir_), std::set<std::string>{"metrics.json"});
  EXPECT_EQ(Read(fs::path(dir_) / "metrics.json"), "m1\n");
  EXPECT_EQ(Names(root_), std::set<std::string>{"run"});
}

TEST_F(RunDirectoryTest, ReplaceSwapsTheWholeRunNeverMixingTwo) {
  ASSERT_TRUE(CommitRunDirectory(dir_, false,
                                 {{"requests.jsonl", "r1\n"}, {"steps.jsonl", "s1\n"}, {"metrics.json", kMetrics1}})
                  .ok());
  // The second run has no steps.jsonl: the first run's must not survive beside the second's files.
  ASSERT_TRUE(CommitRunDirectory(dir_, true, kRun2).ok());
  EXPECT_EQ(Names(dir_), (std::set<std::string>{"metrics.json", "requests.jsonl"}));
  EXPECT_EQ(Read(fs::path(dir_) / "requests.jsonl"), "r2\n");
  EXPECT_EQ(Read(fs::path(dir_) / "metrics.json"), kMetrics2);
  EXPECT_EQ(Names(root_), std::set<std::string>{"run"});  // the earlier run removed, no temporary left
}

TEST_F(RunDirectoryTest, ReplaceRefusesADirectoryHoldingOtherData) {
  fs::create_directories(dir_);
  Put(fs::path(dir_) / "metrics.json", "m1\n");
  Put(fs::path(dir_) / "notes.txt", "mine\n");
  const Status st = CommitRunDirectory(dir_, true, kRun2);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("holds notes.txt, which is not a run's file"), std::string::npos) << st.message();
  EXPECT_EQ(Names(dir_), (std::set<std::string>{"metrics.json", "notes.txt"}));
  EXPECT_EQ(Read(fs::path(dir_) / "notes.txt"), "mine\n");
}

TEST_F(RunDirectoryTest, ReplaceRefusesAUsersFilesThatBearARunsNames) {
  // metrics.json and requests.jsonl of the user's own (not JSON naming eldr_version), or no metrics.json at all:
  // not an earlier run, so nothing is replaced.
  for (const std::string& metrics : {std::string("precious\n"), std::string("{\"loss\": 0.1}\n"), std::string()}) {
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    Put(fs::path(dir_) / "requests.jsonl", "mine\n");
    if (!metrics.empty()) Put(fs::path(dir_) / "metrics.json", metrics);
    const Status st = CommitRunDirectory(dir_, true, kRun2);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find(metrics.empty() ? "holds no metrics.json, which every run writes"
                                                : "holds a metrics.json that no eldr run wrote"),
              std::string::npos)
        << st.message();
    EXPECT_EQ(Read(fs::path(dir_) / "requests.jsonl"), "mine\n");
    if (!metrics.empty()) {
      EXPECT_EQ(Read(fs::path(dir_) / "metrics.json"), metrics);
    }
  }
}

TEST_F(RunDirectoryTest, SymlinkAndFileAreRefused) {
  fs::create_directories(root_ / "elsewhere");
  fs::create_directory_symlink(root_ / "elsewhere", dir_);
  Status st = CommitRunDirectory(dir_, true, kRun2);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("is a symlink"), std::string::npos) << st.message();
  EXPECT_TRUE(fs::is_empty(root_ / "elsewhere"));
  const std::string file = (root_ / "plain").string();
  Put(file, "x");
  st = CommitRunDirectory(file, true, kRun2);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("is not a directory"), std::string::npos) << st.message();
  EXPECT_EQ(Read(file), "x");
}

TEST_F(RunDirectoryTest, AFailedWriteLeavesTheEarlierRunAndNoTemporary) {
  ASSERT_TRUE(CommitRunDirectory(dir_, false, kRun2).ok());
  // A file the set cannot write (its directory does not exist inside the temporary): nothing is committed.
  const Status st = CommitRunDirectory(dir_, true, {{"requests.jsonl", "r3\n"}, {"missing/metrics.json", "m3\n"}});
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(Names(dir_), (std::set<std::string>{"metrics.json", "requests.jsonl"}));
  EXPECT_EQ(Read(fs::path(dir_) / "requests.jsonl"), "r2\n");
  EXPECT_EQ(Names(root_), std::set<std::string>{"run"});
}

// The claim (RunDirectoryClaim): a second job given the same output.dir is refused while the first holds it, by a
// message naming the holder; released, the lock file is gone and the next job gets it. flock(2) locks belong to an
// open file description, so two claims in one process conflict as two processes' would.
TEST_F(RunDirectoryTest, ClaimRefusesASecondJobUntilReleased) {
  {
    Result<RunDirectoryClaim> first = RunDirectoryClaim::Acquire(dir_);
    ASSERT_TRUE(first.ok()) << first.status().message();
    EXPECT_EQ(Names(root_), std::set<std::string>{".run.eldr-lock"});  // beside output.dir, nothing inside it yet
    EXPECT_EQ(Read(root_ / ".run.eldr-lock").rfind("pid " + std::to_string(::getpid()) + " on ", 0), 0u);
    Result<RunDirectoryClaim> second = RunDirectoryClaim::Acquire(dir_ + "/");  // the same directory, spelt otherwise
    ASSERT_FALSE(second.ok());
    EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(second.status().message().find("output.dir " + dir_ + "/ is in use by another eldr job (pid " +
                                             std::to_string(::getpid()) + " on "),
              std::string::npos)
        << second.status().message();
    // The first job commits its run while it holds the claim.
    ASSERT_TRUE(CommitRunDirectory(dir_, false, kRun2).ok());
  }
  EXPECT_EQ(Names(root_), std::set<std::string>{"run"});  // the lock file went with the claim
  EXPECT_TRUE(RunDirectoryClaim::Acquire(dir_).ok());
}

TEST_F(RunDirectoryTest, ClaimReusesAStaleLockFileOfADeadJob) {
  Put(root_ / ".run.eldr-lock", "pid 1 on gone\n");  // left by a SIGKILLed job: the kernel dropped its lock
  Result<RunDirectoryClaim> claim = RunDirectoryClaim::Acquire(dir_);
  ASSERT_TRUE(claim.ok()) << claim.status().message();
  EXPECT_EQ(Read(root_ / ".run.eldr-lock").rfind("pid " + std::to_string(::getpid()) + " on ", 0), 0u);
}

TEST_F(RunDirectoryTest, ClaimCreatesMissingParentsAndRemovesThemWhenNoRunCame) {
  const fs::path deep = root_ / "a" / "b" / "run";
  {
    Result<RunDirectoryClaim> claim = RunDirectoryClaim::Acquire(deep.string());
    ASSERT_TRUE(claim.ok()) << claim.status().message();
    EXPECT_EQ(Names(root_ / "a" / "b"), std::set<std::string>{".run.eldr-lock"});
  }
  EXPECT_TRUE(Names(root_).empty());  // a failed run leaves no empty directory behind
  {
    Result<RunDirectoryClaim> claim = RunDirectoryClaim::Acquire(deep.string());
    ASSERT_TRUE(claim.ok());
    ASSERT_TRUE(CommitRunDirectory(deep.string(), false, kRun2).ok());
  }
  EXPECT_EQ(Names(root_ / "a" / "b"), std::set<std::string>{"run"});  // kept: the run is in it
}

// A lock file eldr did not make (a link, a FIFO) is refused and left in place: never locked through, never removed.
TEST_F(RunDirectoryTest, ClaimRefusesALockFileThatIsNotARegularFile) {
  const fs::path lock = root_ / ".run.eldr-lock";
  ASSERT_EQ(::mkfifo(lock.c_str(), 0644), 0);
  Result<RunDirectoryClaim> fifo = RunDirectoryClaim::Acquire(dir_);  // must not block in open() either
  ASSERT_FALSE(fifo.ok());
  EXPECT_NE(fifo.status().message().find("is not a regular file, not one eldr made; remove it"), std::string::npos)
      << fifo.status().message();
  EXPECT_TRUE(fs::is_fifo(lock));
  fs::remove(lock);
  fs::create_symlink(root_ / "elsewhere", lock);
  Result<RunDirectoryClaim> link = RunDirectoryClaim::Acquire(dir_);
  ASSERT_FALSE(link.ok());
  EXPECT_NE(link.status().message().find("is a symbolic link, not one eldr made; remove it"), std::string::npos)
      << link.status().message();
  EXPECT_TRUE(fs::is_symlink(lock));
  EXPECT_FALSE(fs::exists(root_ / "elsewhere"));  // nothing created through the link
}

}  // namespace
}  // namespace eldr

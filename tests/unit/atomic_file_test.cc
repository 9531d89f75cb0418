// The file policy (runtime/common/atomic_file.h) and the deferred signals (runtime/common/signals.h): inputs
// that are not regular files, refused outputs (links, device nodes, FIFOs, directories, an input, twice the same
// output), the commit (no temporary left, refused after a signal), OutputSet all-or-none, and HDF5 write errors as
// Status values.
#include "runtime/common/atomic_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "runtime/common/hdf5.h"
#include "runtime/common/signals.h"

namespace eldr {
namespace {

namespace fs = std::filesystem;

class AtomicFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("eldr_atomic_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_ / "sub");
    ClearInterruptForTesting();
  }
  void TearDown() override {
    ClearInterruptForTesting();
    fs::remove_all(dir_);
  }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  void WriteText(const std::string& name, const std::string& text) { std::ofstream(Path(name)) << text; }
  std::string ReadText(const std::string& name) const {
    std::ifstream f(Path(name));
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  // Names in the directory (not recursive), "sub" excluded.
  std::vector<std::string> Entries() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) {
      if (e.path().filename() != "sub") out.push_back(e.path().filename().string());
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  fs::path dir_;
};

// A temporary left by a killed writer of this host (its pid gone) is removed by the next commit of that output;
// a live process's, another host's and another output's are not. The names are made by hand from the documented
// form ".<name>.tmp.<host>.<pid>".
TEST_F(AtomicFileTest, ACommitRemovesTheTemporariesOfDeadWritersOnThisHostOnly) {
  // A pid no process can have: Linux gives out pids below /proc/sys/kernel/pid_max. (A waited-for child's pid, used
  // before, could be given to another process before the commit looked.)
  pid_t dead = 0;
  std::ifstream("/proc/sys/kernel/pid_max") >> dead;
  ASSERT_GT(dead, 1);
  ASSERT_EQ(::kill(dead, 0), -1);
  ASSERT_EQ(errno, ESRCH);
  const std::string mine = fs::path(TemporaryPath(Path("out.txt"))).filename().string();
  const std::string prefix = mine.substr(0, mine.rfind('.') + 1);  // ".out.txt.tmp.<host>."
  ASSERT_EQ(prefix.rfind(".out.txt.tmp.", 0), 0u) << prefix;
  const std::string stale_file = prefix + std::to_string(dead);
  const std::string live = prefix + std::to_string(::getppid());
  const std::string other_host = ".out.txt.tmp.not-this-host." + std::to_string(dead);
  const std::string other_output = ".other.txt.tmp." + prefix.substr(13) + std::to_string(dead);
  WriteText(stale_file, "partial");
  WriteText(live, "in progress");
  WriteText(other_host, "theirs");
  WriteText(other_output, "another output's");
  fs::create_directories(dir_ / (prefix + "x"));  // not a pid
  AtomicOutput out(Path("out.txt"));
  EXPECT_EQ(fs::path(out.temp_path()).filename().string(), mine);
  ASSERT_TRUE(out.Write("done").ok());
  ASSERT_TRUE(out.Commit().ok());
  std::vector<std::string> want = {live, other_host, other_output, prefix + "x", "out.txt"};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(Entries(), want);
  // A stale temporary directory (a run directory's) goes too.
  fs::create_directories(dir_ / stale_file / "inside");
  RemoveStaleTemporaries(Path("out.txt"));
  EXPECT_FALSE(fs::exists(dir_ / stale_file));
}

TEST_F(AtomicFileTest, AbsentAndRegularOutputsAreAccepted) {
  EXPECT_TRUE(CheckOutputPath(Path("new.h5")).ok());
  WriteText("old.h5", "x");
  EXPECT_TRUE(CheckOutputPath(Path("old.h5")).ok());
}

TEST_F(AtomicFileTest, RefusesSymlinkFifoDirectoryAndDevice) {
  WriteText("target", "keep");
  fs::create_symlink(Path("target"), Path("link"));
  ASSERT_EQ(::mkfifo(Path("fifo").c_str(), 0644), 0);
  fs::create_directory(Path("dir"));
  struct {
    std::string path, kind;
  } cases[] = {{Path("link"), "a symbolic link"},
               {Path("fifo"), "a FIFO"},
               {Path("dir"), "a directory"},
               {"/dev/null", "a character device"}};
  for (const auto& c : cases) {
    Status st = CheckOutputPath(c.path);
    ASSERT_FALSE(st.ok()) << c.path;
    EXPECT_EQ(st.message().rfind(c.path + ": cannot write: it is " + c.kind, 0), 0u) << st.message();
  }
  EXPECT_EQ(ReadText("target"), "keep");
}

TEST_F(AtomicFileTest, InputsMustBeRegularFiles) {
  WriteText("in.txt", "x");
  ASSERT_EQ(::symlink(Path("in.txt").c_str(), Path("alias.txt").c_str()), 0);
  EXPECT_TRUE(CheckInputFile(Path("in.txt")).ok());
  EXPECT_TRUE(CheckInputFile(Path("alias.txt")).ok());  // a link to a regular file is followed
  EXPECT_EQ(CheckInputFile(Path("none")).message(), Path("none") + ": no such file");
  EXPECT_EQ(CheckInputFile(Path("none")).code(), StatusCode::kNotFound);
  EXPECT_EQ(CheckInputFile(Path("in.txt/x")).message(), Path("in.txt/x") + ": no such file");
  EXPECT_EQ(CheckInputFile(Path("sub"), "a job config file").message(),
            Path("sub") + ": is a directory, expected a job config file");
  EXPECT_EQ(CheckInputFile(Path("sub")).message(), Path("sub") + ": is a directory");
  ASSERT_EQ(::mkfifo(Path("fifo").c_str(), 0600), 0);
  const Status fifo = CheckInputFile(Path("fifo"));  // returns at once: the FIFO is not opened
  EXPECT_EQ(fifo.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(fifo.message().rfind(Path("fifo") + ": is a FIFO, not a regular file;", 0), 0u) << fifo.message();
  EXPECT_EQ(CheckInputFile("/dev/null").message().rfind("/dev/null: is a character device, not a regular file", 0), 0u);
}

TEST_F(AtomicFileTest, StreamInputsTakeAFifoAndEndOnASignal) {
  WriteText("in.txt", "plain");
  int fd = -1;
  ASSERT_TRUE(OpenInputStream(Path("in.txt"), "", &fd).ok());
  char buf[16] = {};
  EXPECT_EQ(::read(fd, buf, sizeof buf), 5);
  EXPECT_EQ(std::string(buf, 5), "plain");
  ::close(fd);
  EXPECT_EQ(OpenInputStream(Path("sub"), "a JSONL trace", &fd).message(),
            Path("sub") + ": is a directory, expected a JSONL trace");
  EXPECT_EQ(fd, -1);
  EXPECT_EQ(OpenInputStream("/dev/null", "", &fd).message().rfind("/dev/null: is a character device", 0), 0u);

  // A FIFO whose writer comes after the reader: the reader waits, then reads what was written, blocking.
  ASSERT_EQ(::mkfifo(Path("fifo").c_str(), 0600), 0);
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::ofstream(Path("fifo")) << "piped";
  });
  ASSERT_TRUE(OpenInputStream(Path("fifo"), "", &fd).ok());
  std::string got;
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) got.append(buf, static_cast<size_t>(n));
  ::close(fd);
  writer.join();
  EXPECT_EQ(got, "piped");

  // No writer ever: a signal ends the wait with the interrupt status and no descriptor.
  InstallInterruptHandlers();
  std::thread signaller([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ::kill(::getpid(), SIGTERM);
  });
  const Status waited = OpenInputStream(Path("fifo"), "", &fd);
  signaller.join();
  EXPECT_EQ(waited.message(), "interrupted by SIGTERM");
  EXPECT_EQ(fd, -1);
  ClearInterruptForTesting();
}

TEST_F(AtomicFileTest, RefusesAnOutputThatIsAnInput) {
  WriteText("x.h5", "input");
  // Direct, through "../sub/..", through a symbolic link to the input, and a hard link.
  fs::create_symlink(Path("x.h5"), Path("alias.h5"));
  fs::create_hard_link(Path("x.h5"), Path("hard.h5"));
  const std::string spellings[] = {Path("x.h5"), Path("sub/../x.h5"), (dir_ / "sub" / ".." / "x.h5").string()};
  for (const auto& out : spellings) {
    Status st = CheckOutputs({{out, "--out"}}, {{Path("x.h5"), "--trace"}});
    ASSERT_FALSE(st.ok()) << out;
    EXPECT_EQ(st.message(), out + ": --out is the same file as the input --trace (" + Path("x.h5") +
                                "); writing it would destroy the input");
  }
  EXPECT_FALSE(CheckOutputs({{Path("x.h5"), "--out"}}, {{Path("alias.h5"), "--in"}}).ok());
  EXPECT_FALSE(CheckOutputs({{Path("hard.h5"), "--out"}}, {{Path("x.h5"), "--in"}}).ok());
  // A different file, a missing input and options not given are fine.
  EXPECT_TRUE(CheckOutputs({{Path("y.h5"), "--out"}}, {{Path("x.h5"), "--trace"}, {"", "--refit"}}).ok());
  EXPECT_TRUE(CheckOutputs({{Path("y.h5"), "--out"}, {"", "--report"}}, {{Path("missing.h5"), "--trace"}}).ok());
  EXPECT_EQ(ReadText("x.h5"), "input");
}

TEST_F(AtomicFileTest, RefusesTwiceTheSameOutput) {
  // Neither exists yet: compared by the resolved path.
  Status st = CheckOutputs({{Path("c.h5"), "--out"}, {Path("sub/../c.h5"), "--report"}}, {});
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(), Path("sub/../c.h5") + ": --report is the same file as the output --out (" + Path("c.h5") +
                              "); give two different files");
  WriteText("c.h5", "old");
  EXPECT_FALSE(CheckOutputs({{Path("c.h5"), "--out"}, {Path("sub/../c.h5"), "--report"}}, {}).ok());
  EXPECT_TRUE(CheckOutputs({{Path("c.h5"), "--out"}, {Path("r.json"), "--report"}}, {}).ok());
}

TEST_F(AtomicFileTest, CommitRenamesAndLeavesNoTemporary) {
  {
    AtomicOutput out(Path("a.txt"));
    ASSERT_TRUE(out.CheckWritable().ok());
    ASSERT_TRUE(out.Write("hello").ok());
    EXPECT_EQ(Entries(), std::vector<std::string>{out.temp_path().substr(out.temp_path().rfind('/') + 1)});
    ASSERT_TRUE(out.Commit().ok());
  }
  EXPECT_EQ(ReadText("a.txt"), "hello");
  EXPECT_EQ(Entries(), std::vector<std::string>{"a.txt"});
}

TEST_F(AtomicFileTest, UncommittedOutputRemovesItsTemporary) {
  WriteText("a.txt", "old");
  {
    AtomicOutput out(Path("a.txt"));
    ASSERT_TRUE(out.Write("new").ok());
  }
  EXPECT_EQ(ReadText("a.txt"), "old");
  EXPECT_EQ(Entries(), std::vector<std::string>{"a.txt"});
}

TEST_F(AtomicFileTest, CommitRefusesALinkPutThereAfterTheCheck) {
  WriteText("target", "keep");
  {
    AtomicOutput out(Path("a.txt"));
    ASSERT_TRUE(out.CheckWritable().ok());
    ASSERT_TRUE(out.Write("new").ok());
    fs::create_symlink(Path("target"), Path("a.txt"));
    Status st = out.Commit();
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("a symbolic link"), std::string::npos) << st.message();
  }
  EXPECT_TRUE(fs::is_symlink(Path("a.txt")));
  EXPECT_EQ(ReadText("target"), "keep");
  EXPECT_EQ(Entries(), (std::vector<std::string>{"a.txt", "target"}));
}

TEST_F(AtomicFileTest, SignalIsRecordedAndCommitRefused) {
  InstallInterruptHandlers();
  EXPECT_FALSE(Interrupted());
  ASSERT_EQ(std::raise(SIGTERM), 0);  // the handler only records it: the test keeps running
  ASSERT_EQ(std::raise(SIGINT), 0);   // the first one wins
  EXPECT_TRUE(Interrupted());
  EXPECT_EQ(InterruptSignal(), SIGTERM);
  EXPECT_EQ(InterruptExitCode(), 128 + SIGTERM);
  EXPECT_EQ(InterruptStatus().message(), "interrupted by SIGTERM");
  {
    AtomicOutput out(Path("a.txt"));
    ASSERT_TRUE(out.Write("new").ok());
    Status st = out.Commit();
    EXPECT_EQ(st.message(), Path("a.txt") + ": interrupted by SIGTERM");
  }
  EXPECT_TRUE(Entries().empty());
  ClearInterruptForTesting();
  ASSERT_EQ(std::raise(SIGHUP), 0);
  EXPECT_EQ(InterruptStatus().message(), "interrupted by SIGHUP");
}

TEST_F(AtomicFileTest, TakeInterruptHandsOverAndRestoreGivesTheDefaultsBack) {
  InstallInterruptHandlers();
  EXPECT_EQ(TakeInterrupt(), 0);
  ASSERT_EQ(std::raise(SIGHUP), 0);
  EXPECT_EQ(TakeInterrupt(), SIGHUP);  // taken: forgotten here
  EXPECT_FALSE(Interrupted());
  EXPECT_EQ(TakeInterrupt(), 0);
  RestoreInheritedSignalActions();  // no RecordSignalsFromStart before: every action back to its default
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction now = {};
    ASSERT_EQ(sigaction(sig, nullptr, &now), 0);
    EXPECT_EQ(now.sa_handler, SIG_DFL) << sig;
  }
  // A process started with ELDR_PENDING_SIGNAL has sent itself the signal; without it nothing is sent.
  char other[] = "PATH=/bin";
  std::string fault = "ELDR_PENDING_SIGNAL=" + std::to_string(SIGHUP);
  char* env_without[] = {other, nullptr};
  char* env_with[] = {other, fault.data(), nullptr};
  RecordSignalsFromStart(0, nullptr, env_without);
  EXPECT_FALSE(Interrupted());
  RecordSignalsFromStart(0, nullptr, env_with);
  EXPECT_EQ(InterruptSignal(), SIGHUP);
  ClearInterruptForTesting();
  // A signal the process inherited as ignored (nohup's SIGHUP) stays ignored from the start and after the restore;
  // the others get their default action back.
  RestoreInheritedSignalActions();
  std::signal(SIGHUP, SIG_IGN);
  RecordSignalsFromStart(0, nullptr, env_with);  // the hook's SIGHUP is ignored too
  EXPECT_FALSE(Interrupted());
  RestoreInheritedSignalActions();
  struct sigaction hup = {}, term = {};
  ASSERT_EQ(sigaction(SIGHUP, nullptr, &hup), 0);
  ASSERT_EQ(sigaction(SIGTERM, nullptr, &term), 0);
  EXPECT_EQ(hup.sa_handler, SIG_IGN);
  EXPECT_EQ(term.sa_handler, SIG_DFL);
  std::signal(SIGHUP, SIG_DFL);
  RecordSignalsFromStart(0, nullptr, env_without);  // nothing ignored at the start any more
  RestoreInheritedSignalActions();
}

TEST_F(AtomicFileTest, OutputSetCommitsAllOrNone) {
  {
    OutputSet set;
    AtomicOutput& a = set.Add(Path("a.h5"), "--out");
    AtomicOutput& b = set.Add(Path("b.json"), "--report");
    ASSERT_TRUE(set.CheckWritable().ok());
    ASSERT_TRUE(a.Write("A").ok());
    ASSERT_TRUE(b.Write("B").ok());
    ASSERT_TRUE(set.CommitAll().ok());
  }
  EXPECT_EQ(ReadText("a.h5"), "A");
  EXPECT_EQ(ReadText("b.json"), "B");
  fs::remove(Path("a.h5"));
  fs::remove(Path("b.json"));
  {
    // The second temporary was never written: the first output must not appear either.
    OutputSet set;
    ASSERT_TRUE(set.Add(Path("a.h5")).Write("A").ok());
    set.Add(Path("b.json"));
    EXPECT_FALSE(set.CommitAll().ok());
  }
  EXPECT_TRUE(Entries().empty());
  {
    OutputSet set;
    set.Add(Path("a.h5"), "--out");
    set.Add(Path("sub/../a.h5"), "--report");
    EXPECT_FALSE(set.CheckWritable().ok());
  }
}

TEST_F(AtomicFileTest, WriteFilesAtomicWritesAllOrNone) {
  ASSERT_TRUE(WriteFilesAtomic({{Path("metrics.json"), "{}"}, {Path("requests.jsonl"), "r\n"}}).ok());
  EXPECT_EQ(ReadText("metrics.json"), "{}");
  EXPECT_EQ(ReadText("requests.jsonl"), "r\n");
  // The second path is refused: the first one keeps its old content, and no temporary is left.
  fs::create_symlink(Path("metrics.json"), Path("steps.jsonl"));
  Status st = WriteFilesAtomic({{Path("requests.jsonl"), "new\n"}, {Path("steps.jsonl"), "s\n"}});
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message().rfind(Path("steps.jsonl") + ": cannot write: it is a symbolic link", 0), 0u) << st.message();
  EXPECT_EQ(ReadText("requests.jsonl"), "r\n");
  EXPECT_EQ(Entries(), (std::vector<std::string>{"metrics.json", "requests.jsonl", "steps.jsonl"}));
  // An output that is an input.
  EXPECT_FALSE(WriteFilesAtomic({{Path("metrics.json"), "x"}}, {{Path("metrics.json"), "--config"}}).ok());
  EXPECT_EQ(ReadText("metrics.json"), "{}");
}

TEST_F(AtomicFileTest, WriteFileAtomicReportsAFullDevice) {
  // /dev/full's temporary cannot be made, and the node itself is refused.
  Status st = WriteFileAtomic("/dev/full", "x");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message().rfind("/dev/full: cannot write: it is a character device", 0), 0u) << st.message();
}

// /dev/full fails every write with ENOSPC: the HDF5 write path must turn that into a Status naming the
// file, and closing after the error must not crash.
TEST_F(AtomicFileTest, Hdf5WriteErrorsAreStatusValues) {
  auto f = h5::File::Create("/dev/full", "full.h5");
  if (!f.ok()) {
    EXPECT_EQ(f.status().message().rfind("full.h5: ", 0), 0u) << f.status().message();
    return;
  }
  std::vector<float> data(1 << 18, 1.0f);
  Status st = f->Write("/x/data", data, {data.size()}, true);
  if (st.ok()) st = f->WriteAttribute("/", "format", std::string("test"));
  Status closed = f->Close();
  EXPECT_FALSE(st.ok() && closed.ok());
  const Status& first = st.ok() ? closed : st;
  EXPECT_EQ(first.message().rfind("full.h5: ", 0), 0u) << first.message();
}

}  // namespace
}  // namespace eldr

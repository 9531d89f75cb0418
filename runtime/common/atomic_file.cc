#include "runtime/common/atomic_file.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "runtime/common/signals.h"

namespace eldr {

namespace fs = std::filesystem;

namespace {

std::string DirOf(const std::string& path) {
  fs::path dir = fs::path(path).parent_path();
  return dir.empty() ? std::string(".") : dir.string();
}

// What a non-regular final component is, for the refusal; nullptr for a regular file.
const char* KindOf(mode_t mode) {
  if (S_ISREG(mode)) return nullptr;
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// Refuses a final component that exists and is not a regular file (lstat: a link is not followed).
Status CheckFinalComponent(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return Status::Ok();  // absent: it will be created
  const char* kind = KindOf(st.st_mode);
  if (!kind) return Status::Ok();
  std::string why = std::string("it is ") + kind;
  if (S_ISLNK(st.st_mode)) {
    why += "; eldr replaces outputs by renaming and would replace the link, not its target: give the target's path";
  } else if (!S_ISDIR(st.st_mode)) {
    why += ", not a regular file; eldr replaces outputs by renaming and would destroy it";
  }
  return Status::IoError(path + ": cannot write: " + why);
}

}  // namespace

Status CheckInputFile(const std::string& path, const std::string& expected) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return Status::NotFound(path + ": no such file");
    return Status::IoError(path + ": cannot read: " + std::strerror(errno));
  }
  if (S_ISDIR(st.st_mode)) {
    return Status::InvalidArgument(path + ": is a directory" + (expected.empty() ? "" : ", expected " + expected));
  }
  const char* kind = KindOf(st.st_mode);
  if (!kind) return Status::Ok();
  return Status::InvalidArgument(path + ": is " + kind +
                                 ", not a regular file; eldr reads its inputs from files (reading this one could "
                                 "block forever): copy the data to a file and give that");
}

Status CheckTextFile(const std::string& path, const std::string& reads) {
  std::ifstream in(path, std::ios::binary);
  char head[512];
  try {  // libstdc++'s filebuf throws on a read error (EIO) whatever the stream's exception mask
    in.read(head, sizeof(head));
  } catch (const std::exception& e) {
    return Status::IoError(path + ": cannot read: " + e.what());
  }
  const std::string bytes(head, static_cast<size_t>(std::max<std::streamsize>(in.gcount(), 0)));
  if (bytes.rfind("\x89HDF\r\n\x1a\n", 0) == 0) {
    return Status::InvalidArgument(path + ": is an HDF5 file (a trace or a calibration?), not text; " + reads);
  }
  if (bytes.rfind("\x1f\x8b", 0) == 0)
    return Status::InvalidArgument(path + ": is gzip-compressed, not text; " + reads);
  const bool utf16 = bytes.rfind("\xff\xfe", 0) == 0 || bytes.rfind("\xfe\xff", 0) == 0;  // a BOM: NULs are text
  if (!utf16 && bytes.find('\0') != std::string::npos) {
    return Status::InvalidArgument(path + ": is a binary file (it holds NUL bytes), not text; " + reads);
  }
  return Status::Ok();
}

Status OpenInputStream(const std::string& path, const std::string& expected, int* fd) {
  *fd = -1;
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISFIFO(st.st_mode)) {
    int f = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (f < 0) return Status::IoError(path + ": cannot open: " + std::strerror(errno));
    // Without a writer, a non-blocking open succeeds and poll() reports nothing until a writer writes or
    // comes and goes; poll() is never restarted after a signal, so the wait ends on one.
    while (true) {
      struct pollfd p = {f, POLLIN, 0};
      int n = ::poll(&p, 1, 200);
      if (Interrupted()) {
        ::close(f);
        return InterruptStatus();
      }
      if (n > 0) break;
      if (n < 0 && errno != EINTR) {
        Status error = Status::IoError(path + ": cannot read: " + std::strerror(errno));
        ::close(f);
        return error;
      }
    }
    int flags = ::fcntl(f, F_GETFL);
    if (flags < 0 || ::fcntl(f, F_SETFL, flags & ~O_NONBLOCK) != 0) {
      Status error = Status::IoError(path + ": cannot read: " + std::strerror(errno));
      ::close(f);
      return error;
    }
    *fd = f;
    return Status::Ok();
  }
  ELDR_RETURN_IF_ERROR(CheckInputFile(path, expected));
  int f = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f < 0) return Status::IoError(path + ": cannot open: " + std::strerror(errno));
  *fd = f;
  return Status::Ok();
}

namespace {

// Identity of a path for the same-file check.
struct FileIdentity {
  bool exists = false;
  dev_t dev = 0;
  ino_t ino = 0;
  std::string resolved;  // for files that do not exist yet
};

FileIdentity Identify(const std::string& path) {
  FileIdentity id;
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    id.exists = true;
    id.dev = st.st_dev;
    id.ino = st.st_ino;
  }
  std::error_code ec;
  fs::path abs = fs::absolute(path, ec);
  fs::path canon = fs::weakly_canonical(ec ? fs::path(path) : abs, ec);
  id.resolved = (ec ? abs.lexically_normal() : canon).string();
  return id;
}

bool SameFile(const FileIdentity& a, const FileIdentity& b) {
  if (a.exists && b.exists) return a.dev == b.dev && a.ino == b.ino;
  if (!a.exists && !b.exists) return a.resolved == b.resolved;
  return false;
}

std::string Describe(const PathArg& p) { return p.option.empty() ? p.path : p.option + " (" + p.path + ")"; }

Status WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::IoError(std::strerror(errno));
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status FsyncPath(const std::string& path, int flags) {
  int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return Status::IoError(std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  // Some file systems cannot fsync a directory (EINVAL); the rename is still atomic there.
  if (rc != 0 && err != EINVAL) return Status::IoError(std::strerror(err));
  return Status::Ok();
}

}  // namespace

Status CheckOutputPath(const std::string& path) {
  if (path.empty()) return Status::InvalidArgument("output path is empty");
  const std::string dir = DirOf(path);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return Status::IoError(path + ": cannot write: directory " + dir + " does not exist");
  }
  ELDR_RETURN_IF_ERROR(CheckFinalComponent(path));
  if (::access(dir.c_str(), W_OK) != 0) {
    return Status::IoError(path + ": cannot write: directory " + dir + ": " + std::strerror(errno));
  }
  return Status::Ok();
}

Status CheckOutputs(const std::vector<PathArg>& outputs, const std::vector<PathArg>& inputs) {
  std::vector<std::pair<const PathArg*, FileIdentity>> seen;
  for (const PathArg& out : outputs) {
    if (out.path.empty()) continue;
    ELDR_RETURN_IF_ERROR(CheckOutputPath(out.path));
    const FileIdentity id = Identify(out.path);
    const std::string who = out.option.empty() ? "" : out.option + " ";
    for (const auto& [other, other_id] : seen) {
      if (SameFile(id, other_id)) {
        return Status::InvalidArgument(out.path + ": " + who + "is the same file as the output " + Describe(*other) +
                                       "; give two different files");
      }
    }
    for (const PathArg& in : inputs) {
      if (in.path.empty()) continue;
      const FileIdentity in_id = Identify(in.path);
      if (in_id.exists && SameFile(id, in_id)) {
        return Status::InvalidArgument(out.path + ": " + who + "is the same file as the input " + Describe(in) +
                                       "; writing it would destroy the input");
      }
    }
    seen.emplace_back(&out, id);
  }
  return Status::Ok();
}

namespace {

// This host's name as a temporary's name carries it (alphanumerics, '-' and '_' kept, the rest '_'), and the
// process's pid namespace ("-ns<inode>" of /proc/self/ns/pid): two containers of one host name see different pids,
// so a pid is only judged dead in its own namespace.
std::string HostTag() {
  char host[256] = {};
  std::string tag = ::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0' ? "host" : host;
  for (char& c : tag) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') c = '_';
  }
  struct stat ns;
  if (::stat("/proc/self/ns/pid", &ns) == 0) tag += "-ns" + std::to_string(static_cast<uint64_t>(ns.st_ino));
  return tag;
}

// ".<name>.tmp.<host>." of `path`: the prefix of every process's temporary of it on this host.
std::string TemporaryPrefix(const fs::path& path) { return "." + path.filename().string() + ".tmp." + HostTag() + "."; }

}  // namespace

std::string TemporaryPath(const std::string& path) {
  const fs::path p(path);
  const std::string name = TemporaryPrefix(p) + std::to_string(::getpid());
  return (p.parent_path().empty() ? fs::path(name) : p.parent_path() / name).string();
}

void RemoveStaleTemporaries(const std::string& path) {
  const fs::path p(path);
  const fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  const std::string prefix = TemporaryPrefix(p);
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string digits = name.substr(prefix.size());
    if (digits.size() > 9 || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    const pid_t pid = static_cast<pid_t>(std::stol(digits));
    if (pid <= 0 || pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive, or not ours to ask
    std::error_code remove_ec;
    fs::remove_all(it->path(), remove_ec);
  }
}

AtomicOutput::AtomicOutput(std::string path) : path_(std::move(path)), temp_path_(TemporaryPath(path_)) {}

AtomicOutput::~AtomicOutput() {
  if (!committed_) ::unlink(temp_path_.c_str());
}

Status AtomicOutput::CheckWritable() const { return CheckOutputPath(path_); }

Status AtomicOutput::CheckWritable(const std::vector<PathArg>& inputs) const {
  return CheckOutputs({{path_, ""}}, inputs);
}

Status AtomicOutput::Write(const std::string& content) const {
  int fd = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) return Status::IoError(path_ + ": cannot write: " + std::strerror(errno));
  Status st = WriteAll(fd, content.data(), content.size());
  if (::close(fd) != 0 && st.ok()) st = Status::IoError(std::strerror(errno));
  if (!st.ok()) return Status::IoError(path_ + ": write failed: " + st.message());
  return Status::Ok();
}

Status AtomicOutput::Prepare() const {
  if (Interrupted()) return InterruptStatus().WithPrefix(path_);
  // The check ran before the work; a link or node put there since must not be replaced either.
  ELDR_RETURN_IF_ERROR(CheckFinalComponent(path_));
  Status st = FsyncPath(temp_path_, O_RDONLY);
  if (!st.ok()) return Status::IoError(path_ + ": cannot flush the finished temporary file: " + st.message());
  return Status::Ok();
}

Status AtomicOutput::Publish() {
  if (std::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    return Status::IoError(path_ + ": cannot rename the finished temporary file into place: " + std::strerror(errno));
  }
  committed_ = true;
  Status st = FsyncPath(DirOf(path_), O_RDONLY | O_DIRECTORY);
  if (!st.ok()) return Status::IoError(path_ + ": written, but its directory cannot be flushed: " + st.message());
  return Status::Ok();
}

Status AtomicOutput::Commit() {
  ELDR_RETURN_IF_ERROR(Prepare());
  ELDR_RETURN_IF_ERROR(Publish());
  RemoveStaleTemporaries(path_);  // a killed earlier writer's, now that this one is in place
  return Status::Ok();
}

AtomicOutput& OutputSet::Add(std::string path, std::string option) {
  outputs_.push_back(std::make_unique<AtomicOutput>(std::move(path)));
  options_.push_back(std::move(option));
  return *outputs_.back();
}

Status OutputSet::CheckWritable(const std::vector<PathArg>& inputs) const {
  std::vector<PathArg> outs;
  for (size_t i = 0; i < outputs_.size(); ++i) outs.push_back({outputs_[i]->path(), options_[i]});
  return CheckOutputs(outs, inputs);
}

Status OutputSet::CommitAll() {
  for (const auto& o : outputs_) ELDR_RETURN_IF_ERROR(o->Prepare());
  for (const auto& o : outputs_) ELDR_RETURN_IF_ERROR(o->Publish());
  for (const auto& o : outputs_) RemoveStaleTemporaries(o->path());  // killed earlier writers', as Commit does
  return Status::Ok();
}

Status WriteFileAtomic(const std::string& path, const std::string& content) {
  AtomicOutput out(path);
  ELDR_RETURN_IF_ERROR(out.CheckWritable());
  ELDR_RETURN_IF_ERROR(out.Write(content));
  return out.Commit();
}

Status WriteFilesAtomic(const std::vector<std::pair<std::string, std::string>>& files,
                        const std::vector<PathArg>& inputs) {
  OutputSet set;
  std::vector<AtomicOutput*> outs;
  for (const auto& [path, content] : files) outs.push_back(&set.Add(path));
  ELDR_RETURN_IF_ERROR(set.CheckWritable(inputs));
  for (size_t i = 0; i < files.size(); ++i) ELDR_RETURN_IF_ERROR(outs[i]->Write(files[i].second));
  return set.CommitAll();
}

}  // namespace eldr

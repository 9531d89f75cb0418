#include "runtime/common/atomic_file.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace eldr {

namespace fs = std::filesystem;

AtomicOutput::AtomicOutput(std::string path) : path_(std::move(path)) {
  fs::path p(path_);
  fs::path dir = p.parent_path();
  std::string name = "." + p.filename().string() + ".tmp." + std::to_string(::getpid());
  temp_path_ = (dir.empty() ? fs::path(name) : dir / name).string();
}

AtomicOutput::~AtomicOutput() {
  if (!committed_) std::remove(temp_path_.c_str());
}

Status AtomicOutput::CheckWritable() const {
  if (path_.empty()) return Status::InvalidArgument("output path is empty");
  fs::path dir = fs::path(path_).parent_path();
  if (dir.empty()) dir = ".";
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return Status::IoError(path_ + ": cannot write: directory " + dir.string() + " does not exist");
  }
  if (fs::is_directory(path_, ec)) return Status::IoError(path_ + ": cannot write: it is a directory");
  if (::access(dir.c_str(), W_OK) != 0) {
    return Status::IoError(path_ + ": cannot write: directory " + dir.string() + ": " + std::strerror(errno));
  }
  return Status::Ok();
}

Status AtomicOutput::Commit() {
  if (std::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    return Status::IoError(path_ + ": cannot rename the finished temporary file into place: " + std::strerror(errno));
  }
  committed_ = true;
  return Status::Ok();
}

Status WriteFileAtomic(const std::string& path, const std::string& content) {
  AtomicOutput out(path);
  ELDR_RETURN_IF_ERROR(out.CheckWritable());
  {
    std::ofstream f(out.temp_path(), std::ios::binary);
    if (!f) return Status::IoError(path + ": cannot write: " + std::strerror(errno));
    f << content;
    f.flush();
    if (!f) return Status::IoError(path + ": write failed: " + std::strerror(errno));
  }
  return out.Commit();
}

}  // namespace eldr

// The output policy of every eldr command (DESIGN.md §5, issue 14): an output file is written under a
// temporary name in its own directory and renamed into place on Commit(), so that a failed or interrupted
// run never leaves a partial file, and an output that would destroy something is refused before any work:
//   - its final path component is an existing non-regular file (a device node, FIFO, socket or directory)
//     or a symbolic link (renaming over it would replace the node or the link, not write through it);
//   - it is the same file (device and inode, after resolving ".." and symbolic links) as an input of the
//     command, or as another output of the same command.
// Commit() fsyncs the temporary, renames it and fsyncs the directory; it refuses once SIGINT, SIGTERM or
// SIGHUP arrived (runtime/common/signals.h). A destroyed, uncommitted AtomicOutput removes its temporary,
// so every error path that unwinds cleans up. OutputSet commits several outputs all or none.
//
// Errors are Status values whose message starts with the output path as the user gave it.
// Thread safety: none; use one AtomicOutput from one thread.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/common/status.h"

namespace eldr {

// A file the command reads or writes, as the user gave it, and the option that named it ("--trace"), for
// messages. An empty path is an option that was not given: every check skips it.
struct PathArg {
  std::string path;
  std::string option;  // may be empty
};

// The input half of the policy: `path` names an existing regular file (a link to one is followed). Refuses,
// before anything is opened, an absent path ("PATH: no such file"), a directory ("PATH: is a directory[,
// expected WHAT]") and any other non-regular file: opening a FIFO with no writer, or reading a device, would
// block or never end, and a reader that waits in open() cannot honour SIGTERM. `expected` names the document
// for the directory message ("a job config file"); may be empty.
Status CheckInputFile(const std::string& path, const std::string& expected = "");

// A text input given a binary file by mistake (a trace or calibration, a gzip, anything with NUL bytes) is named as
// such from its first bytes, instead of a parse error that quotes them: InvalidArgument "PATH: is an HDF5 file (a
// trace or a calibration?), not text; READS". `reads` says what the command reads ("--fit reads eldr serve
// steps.jsonl ..."). OK when the file cannot be opened (the caller's open reports that). REQUIRES: CheckInputFile.
Status CheckTextFile(const std::string& path, const std::string& reads);

// Opens a streamed input for reading (*fd, O_CLOEXEC, blocking): a regular file or a FIFO (a shell pipe,
// `<(zcat trace.jsonl.gz)`, /dev/stdin on a pipe). Other paths are refused as CheckInputFile refuses them. A FIFO
// is opened without blocking and waited on with poll(), so a reader waiting for its writer ends on SIGINT,
// SIGTERM or SIGHUP (InterruptStatus()) instead of hanging in open(). Once data flows, a writer that holds the
// pipe open and stops writing stalls the read; the signal is recorded and takes effect when it writes or closes.
Status OpenInputStream(const std::string& path, const std::string& expected, int* fd);

// The policy for one output path, without creating anything: the directory exists and is writable, and the
// final component is absent or a regular file (not a symbolic link, device, FIFO, socket or directory).
Status CheckOutputPath(const std::string& path);

// CheckOutputPath for every output, then refuses an output that is the same file as an input or as another
// output. Files that do not exist yet are compared by their resolved path (".." and links in the directory
// part followed), existing ones by device and inode. Inputs that do not exist are skipped (their reader
// reports them). Messages: "OUT: --out is the same file as the input --trace (IN); ...".
Status CheckOutputs(const std::vector<PathArg>& outputs, const std::vector<PathArg>& inputs);

// The temporary of `path` for this process: "<dir>/.<name>.tmp.<host>-ns<pid namespace>.<pid>", written and renamed
// into place.
std::string TemporaryPath(const std::string& path);
// Removes the temporaries of `path` (files or directories) that processes of this host left and that no longer run
// (a SIGKILL in the middle of a write): those whose pid is gone. Another host's (on a shared filesystem) and a live
// process's are left alone. Errors are ignored: a temporary that cannot be removed stays, as before.
void RemoveStaleTemporaries(const std::string& path);

class AtomicOutput {
 public:
  // Chooses TemporaryPath(path). Nothing is created yet.
  explicit AtomicOutput(std::string path);
  ~AtomicOutput();  // removes the temporary unless committed
  AtomicOutput(const AtomicOutput&) = delete;
  AtomicOutput& operator=(const AtomicOutput&) = delete;

  // CheckOutputPath(path()).
  Status CheckWritable() const;
  // CheckOutputs({path()}, inputs): also refuses an output that is one of the command's inputs.
  Status CheckWritable(const std::vector<PathArg>& inputs) const;
  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_path_; }

  // Writes `content` to the temporary (created or truncated), checking every write and the close.
  Status Write(const std::string& content) const;
  // fsyncs the temporary, renames it onto path() and fsyncs the directory. Fails (and the destructor then
  // removes the temporary) when a signal arrived, or when path() became a link or a non-regular file since
  // the check. REQUIRES: the temporary was written and closed.
  Status Commit();

 private:
  friend class OutputSet;
  Status Prepare() const;  // everything Commit() checks and fsyncs before the rename
  Status Publish();        // the rename and the directory fsync

  std::string path_;
  std::string temp_path_;
  bool committed_ = false;
};

// Several outputs of one command committed all or none (calibrate's calibration + report; serve's run
// directory). Write every temporary, then CommitAll(): it checks and fsyncs all of them before the first
// rename, so an error while writing, a full disk or a signal leaves none of the outputs; only a rename that
// fails after an earlier one succeeded (an I/O error of the directory itself) leaves the earlier ones in
// place, and is reported. Destroying the set removes every temporary not committed.
class OutputSet {
 public:
  // Adds an output; `option` names it in messages ("--report"). The reference stays valid as long as the set.
  AtomicOutput& Add(std::string path, std::string option = "");
  // CheckOutputs over every output of the set and `inputs`.
  Status CheckWritable(const std::vector<PathArg>& inputs = {}) const;
  Status CommitAll();

 private:
  std::vector<std::unique_ptr<AtomicOutput>> outputs_;
  std::vector<std::string> options_;
};

// Writes `content` to `path` atomically (CheckWritable, Write, Commit).
Status WriteFileAtomic(const std::string& path, const std::string& content);

// Writes several files (path, content) all or none through an OutputSet: every path is checked (and none may be
// the same file as another or as one of `inputs`) before anything is written. For a run directory: metrics.json,
// requests.jsonl, steps.jsonl.
Status WriteFilesAtomic(const std::vector<std::pair<std::string, std::string>>& files,
                        const std::vector<PathArg>& inputs = {});

}  // namespace eldr

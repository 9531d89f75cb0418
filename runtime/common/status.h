// Status and Result<T>: expected failures (bad input, missing file, full cache, rejected request) as
// values that reach the user as one clear line and a non-zero exit (STYLE.md "Errors").
// Bugs and unrecoverable failures use ELDR_CHECK (runtime/common/check.h) instead.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace eldr {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     // the caller's input is wrong (flag, value, file content)
  kNotFound,            // a file or object does not exist
  kIoError,             // reading or writing failed
  kCorrupt,             // a file exists but is not what it claims to be
  kFailedPrecondition,  // inputs are individually valid but do not fit together
  kResourceExhausted,   // a capacity (KV cache, queue) is full
};

const char* StatusCodeName(StatusCode code);

// A message as one terminal line: control characters (a newline, ESC, the C1 controls, the bidirectional overrides)
// and bytes that are not UTF-8 are written as \xNN, and a message longer than 4000 bytes keeps its first 3000 and
// last 800 (moved by up to 3 bytes to a character boundary) with the count cut between them.
// Messages quote file contents and command-line values; printing them raw could split the one error line or
// drive the terminal.
std::string PrintableMessage(const std::string& message);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
  static Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status IoError(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
  static Status Corrupt(std::string m) { return {StatusCode::kCorrupt, std::move(m)}; }
  static Status FailedPrecondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
  static Status ResourceExhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // Returns a copy whose message is "<prefix>: <message>" (context added while unwinding).
  Status WithPrefix(const std::string& prefix) const { return ok() ? *this : Status(code_, prefix + ": " + message_); }
  // WithPrefix(prefix) when the message is about `subject` (starts with it: "t.h5: no such file"), else a copy: a
  // file's error named by what pointed at the file ("workload.trace: t.h5: ...").
  Status WithPrefixIfAbout(const std::string& subject, const std::string& prefix) const {
    return !subject.empty() && message_.rfind(subject, 0) == 0 ? WithPrefix(prefix) : *this;
  }
  std::string ToString() const { return ok() ? "OK" : message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// A value or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}         // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {}  // NOLINT(google-explicit-constructor)
  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOkStatus;
    return ok() ? kOkStatus : std::get<Status>(v_);
  }
  // REQUIRES: ok().
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace eldr

#define ELDR_CONCAT_INNER_(a, b) a##b
#define ELDR_CONCAT_(a, b) ELDR_CONCAT_INNER_(a, b)

#define ELDR_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::eldr::Status eldr_status_ = (expr);        \
    if (!eldr_status_.ok()) return eldr_status_; \
  } while (0)

#define ELDR_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()

#define ELDR_ASSIGN_OR_RETURN(lhs, expr) ELDR_ASSIGN_OR_RETURN_IMPL_(ELDR_CONCAT_(eldr_result_, __LINE__), lhs, expr)

#include "runtime/common/status.h"

namespace eldr {

const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "ok";
    case StatusCode::kInvalidArgument:
      return "invalid argument";
    case StatusCode::kNotFound:
      return "not found";
    case StatusCode::kIoError:
      return "I/O error";
    case StatusCode::kCorrupt:
      return "corrupt";
    case StatusCode::kFailedPrecondition:
      return "failed precondition";
    case StatusCode::kResourceExhausted:
      return "resource exhausted";
  }
  return "unknown";
}

namespace {

// The length of the valid UTF-8 sequence at text[i] (1-4), else 0.
size_t Utf8Length(const std::string& text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char c = byte(i);
  size_t n = 0;
  unsigned lo = 0x80, hi = 0xbf;  // the allowed range of the second byte (no overlong forms, no surrogates)
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    if (c == 0xe0) lo = 0xa0;
    if (c == 0xed) hi = 0x9f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    if (c == 0xf0) lo = 0x90;
    if (c == 0xf4) hi = 0x8f;
  } else {
    return 0;
  }
  if (i + n > text.size() || byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k) {
    if (byte(i + k) < 0x80 || byte(i + k) > 0xbf) return 0;
  }
  return n;
}

std::string EscapeForTerminal(const std::string& text) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if ((c >= 0x20 && c < 0x7f) || c == '\t') {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    const size_t n = c >= 0x80 ? Utf8Length(text, i) : 0;
    if (n > 0) {
      out.append(text, i, n);
      i += n;
      continue;
    }
    out += {'\\', 'x', kHex[c >> 4], kHex[c & 15]};
    ++i;
  }
  return out;
}

}  // namespace

std::string PrintableMessage(const std::string& message) {
  constexpr size_t kMax = 4000, kHead = 3000, kTail = 800;
  if (message.size() <= kMax) return EscapeForTerminal(message);
  // Cut at UTF-8 sequence boundaries (a continuation byte is 10xxxxxx), so the cut never splits a character.
  size_t head = kHead, tail = message.size() - kTail;
  while (head > 0 && (static_cast<unsigned char>(message[head]) & 0xc0) == 0x80) --head;
  while (tail < message.size() && (static_cast<unsigned char>(message[tail]) & 0xc0) == 0x80) ++tail;
  return EscapeForTerminal(message.substr(0, head)) + " [... " + std::to_string(tail - head) + " bytes cut ...] " +
         EscapeForTerminal(message.substr(tail));
}

}  // namespace eldr

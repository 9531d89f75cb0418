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
    size_t n = c >= 0x80 ? Utf8Length(text, i) : 0;
    // Valid UTF-8 that still drives a terminal: the C1 controls U+0080-U+009F (8-bit CSI) and the bidirectional
    // overrides and isolates U+202A-U+202E, U+2066-U+2069, which reorder what follows them.
    const auto b1 = [&] { return static_cast<unsigned char>(text[i + 1]); };
    const auto b2 = [&] { return static_cast<unsigned char>(text[i + 2]); };
    if ((n == 2 && c == 0xc2 && b1() < 0xa0) ||
        (n == 3 && c == 0xe2 &&
         ((b1() == 0x80 && b2() >= 0xaa && b2() <= 0xae) || (b1() == 0x81 && b2() >= 0xa6 && b2() <= 0xa9)))) {
      n = 0;
    }
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
  // Cut at UTF-8 sequence boundaries (a continuation byte is 10xxxxxx), so the cut never splits a character: at
  // most 3 bytes either way (a character has at most 4), whatever bytes a binary message holds.
  size_t head = kHead, tail = message.size() - kTail;
  const auto continuation = [&](size_t i) { return (static_cast<unsigned char>(message[i]) & 0xc0) == 0x80; };
  for (int k = 0; k < 3 && continuation(head); ++k) --head;
  for (int k = 0; k < 3 && tail < message.size() && continuation(tail); ++k) ++tail;
  return EscapeForTerminal(message.substr(0, head)) + " [... " + std::to_string(tail - head) + " bytes cut ...] " +
         EscapeForTerminal(message.substr(tail));
}

}  // namespace eldr

// PrintableMessage (runtime/common/status.h): every error line the command line prints goes through it. Each case
// is written out by hand: control characters and bytes that are not UTF-8 become \xNN, valid UTF-8 stays, and a
// long message keeps its head and tail with the count of bytes cut.
#include "runtime/common/status.h"

#include <gtest/gtest.h>

#include <string>

namespace eldr {
namespace {

TEST(PrintableMessage, EscapesControlCharactersAndInvalidUtf8) {
  EXPECT_EQ(PrintableMessage("plain text: 1 + 1 = 2"), "plain text: 1 + 1 = 2");
  EXPECT_EQ(PrintableMessage("a\nb"), "a\\x0ab");
  EXPECT_EQ(PrintableMessage("\x1b[31mred"), "\\x1b[31mred");
  EXPECT_EQ(PrintableMessage("tab\tstays"), "tab\tstays");
  EXPECT_EQ(PrintableMessage(std::string("nul\0x", 5)), "nul\\x00x");
  EXPECT_EQ(PrintableMessage("del\x7f"), "del\\x7f");
  // Valid UTF-8 of two, three and four bytes is kept.
  EXPECT_EQ(PrintableMessage("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"), "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
  // Not UTF-8: a lone continuation byte, a Latin-1 byte, an overlong '/', a surrogate, a sequence cut short.
  EXPECT_EQ(PrintableMessage("\x80"), "\\x80");
  EXPECT_EQ(PrintableMessage("\x89HDF"), "\\x89HDF");
  EXPECT_EQ(PrintableMessage("\xc0\xaf"), "\\xc0\\xaf");
  EXPECT_EQ(PrintableMessage("\xed\xa0\x80"), "\\xed\\xa0\\x80");
  EXPECT_EQ(PrintableMessage("\xe2\x82"), "\\xe2\\x82");
  EXPECT_EQ(PrintableMessage("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");  // above U+10FFFF
  // Valid UTF-8 that drives a terminal: a C1 control (8-bit CSI, U+009B) and a right-to-left override (U+202E);
  // U+00A0 (no-break space) and U+2030 (per mille) are plain text.
  EXPECT_EQ(PrintableMessage("\xc2\x9b"
                             "31m"),
            "\\xc2\\x9b"
            "31m");
  EXPECT_EQ(PrintableMessage("a\xe2\x80\xae"
                             "b"),
            "a\\xe2\\x80\\xae"
            "b");
  EXPECT_EQ(PrintableMessage("\xc2\xa0\xe2\x80\xb0"), "\xc2\xa0\xe2\x80\xb0");
}

TEST(PrintableMessage, CutsALongMessageBetweenItsHeadAndTail) {
  const std::string at_limit(4000, 'a');
  EXPECT_EQ(PrintableMessage(at_limit), at_limit);
  const std::string long_message = "HEAD" + std::string(10000, 'x') + "TAIL";  // 10008 bytes
  const std::string cut = PrintableMessage(long_message);
  EXPECT_EQ(cut, "HEAD" + std::string(2996, 'x') + " [... 6208 bytes cut ...] " + std::string(796, 'x') + "TAIL");
  // A cut never splits a UTF-8 character: 'é' (2 bytes) across byte 3000 moves the cut before it.
  const std::string accents = std::string(2999, 'a') + "\xc3\xa9" + std::string(5000, 'b');
  const std::string kept = PrintableMessage(accents);
  EXPECT_EQ(kept.substr(0, 2999 + 6), std::string(2999, 'a') + " [... ");
  EXPECT_EQ(kept.find("\\x"), std::string::npos) << "no half character escaped";
  // Bytes that are all continuation bytes: the cut moves at most 3 bytes, so head and tail keep their size. 5016
  // bytes: the head ends at 3000 - 3, the tail starts at 5016 - 800 + 3, and 4219 - 2997 = 1222 are cut.
  const std::string binary = "bad bytes '" + std::string(5000, '\x80') + "' end";
  const std::string shown = PrintableMessage(binary);
  EXPECT_EQ(shown.substr(0, 11), "bad bytes '");
  EXPECT_NE(shown.find(" [... 1222 bytes cut ...] "), std::string::npos) << shown.substr(0, 80);
}

}  // namespace
}  // namespace eldr

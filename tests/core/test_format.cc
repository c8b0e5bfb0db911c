// printable_text: what a sample prints, and what it escapes.
#include <gtest/gtest.h>

#include <string>

#include "tandem/core/format.h"

namespace tandem {
namespace {

TEST(PrintableText, KeepsTextAndEscapesControlBytes) {
  struct Case {
    std::string bytes, printed;
  };
  const Case cases[] = {
      {"ROMEO:\n\tHe jests at scars", "ROMEO:\n\tHe jests at scars"},
      {"a\x1b[2Jb", "a\\x1B[2Jb"},          // ESC: a terminal would clear the screen
      {"line\rover", "line\\x0Dover"},      // CR rewrites a line in a log
      {std::string("a\0b", 3), "a\\x00b"},  // NUL
      {"\x7f", "\\x7F"},                    // DEL
      {"caf\xc3\xa9 \xe2\x80\x94 \xf0\x9f\x98\x80", "caf\xc3\xa9 \xe2\x80\x94 \xf0\x9f\x98\x80"},
      {"\xc2\x9b", "\\xC2\\x9B"},                    // U+009B, a C1 control (CSI) in UTF-8
      {"\xc3", "\\xC3"},                             // a lead byte cut off at the end
      {"\xc3(", "\\xC3("},                           // a lead byte without its continuation
      {"\xc0\xaf", "\\xC0\\xAF"},                    // an overlong '/'
      {"\xed\xa0\x80", "\\xED\\xA0\\x80"},           // a UTF-16 surrogate
      {"\xf4\x90\x80\x80", "\\xF4\\x90\\x80\\x80"},  // past U+10FFFF
      {"\x80", "\\x80"},                             // a stray continuation byte
  };
  for (const Case& c : cases) EXPECT_EQ(printable_text(c.bytes), c.printed) << c.printed;
}

TEST(PrintableText, EveryByteComesOutPrintable) {
  std::string all;
  for (int b = 0; b < 256; b++) all += static_cast<char>(b);
  for (const char c : printable_text(all)) {
    const auto u = static_cast<unsigned char>(c);
    EXPECT_TRUE((u >= 0x20 && u < 0x7F) || u == '\n' || u == '\t') << int(u);
  }
}

}  // namespace
}  // namespace tandem

// printable_text: what a sample prints, and what it escapes. shell_word: what /bin/sh reads
// back from it.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

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

// The shell is the reference: each word, quoted, comes back from `printf %s` byte for byte,
// and a word with nothing special stays unquoted (the printed command reads as typed).
TEST(ShellWord, TheShellReadsBackEveryWord) {
  const std::vector<std::string> words = {"train",    "runs/a-b_c.json", "a b",  "it's",
                                          "",         "$HOME",           "`id`", "a\\b\"c",
                                          "x;rm -rf", "line\nbreak",     "*",    "caf\xc3\xa9"};
  for (const std::string& word : words) {
    const std::string command = "printf %s " + shell_word(word);
    FILE* shell = ::popen(command.c_str(), "r");
    ASSERT_NE(shell, nullptr) << command;
    std::string echoed;
    char buffer[256];
    for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, shell)) > 0;) echoed.append(buffer, n);
    ASSERT_EQ(::pclose(shell), 0) << command;
    EXPECT_EQ(echoed, word) << command;
  }
  EXPECT_EQ(shell_word("runs/a-b_c.json"), "runs/a-b_c.json");
  EXPECT_EQ(shell_word("it's"), "'it'\\''s'");
  EXPECT_EQ(shell_word(""), "''");
}

}  // namespace
}  // namespace tandem

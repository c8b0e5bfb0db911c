#include "tandem/core/format.h"

#include <cstdio>
#include <iterator>

namespace tandem {

std::string format_bytes(size_t bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < std::size(units)) {
    value /= 1024.0;
    unit++;
  }
  char text[64];
  std::snprintf(text, sizeof text, unit == 0 ? "%.0f %s" : "%.2f %s", value, units[unit]);
  return text;
}

std::string format_fixed(double value, int decimals) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  return text;
}

namespace {

// The length of the well-formed UTF-8 sequence of two or more bytes at bytes[i], or 0.
size_t utf8_sequence_length(std::string_view bytes, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(bytes[k]); };
  const unsigned char lead = byte(i);
  size_t length = 0;
  unsigned char low = 0x80, high = 0xBF;  // the range of the second byte (RFC 3629's table)
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;   // no overlong forms
    if (lead == 0xED) high = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;  // nothing past U+10FFFF
  } else {
    return 0;
  }
  if (i + length > bytes.size() || byte(i + 1) < low || byte(i + 1) > high) return 0;
  for (size_t k = 2; k < length; k++)
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  // C1 control characters (U+0080-U+009F) are control bytes too, in UTF-8's clothes.
  if (lead == 0xC2 && byte(i + 1) <= 0x9F) return 0;
  return length;
}

}  // namespace

std::string shell_word(std::string_view word) {
  constexpr std::string_view kPlain =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-+=.,/:@%";
  if (!word.empty() && word.find_first_not_of(kPlain) == std::string_view::npos)
    return std::string(word);
  std::string quoted = "'";
  for (char c : word) quoted += c == '\'' ? std::string_view("'\\''") : std::string_view(&c, 1);
  return quoted + "'";
}

std::string printable_text(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    if ((c >= 0x20 && c < 0x7F) || c == '\n' || c == '\t') {
      out += static_cast<char>(c);
      i++;
      continue;
    }
    if (const size_t length = c >= 0x80 ? utf8_sequence_length(bytes, i) : 0; length > 0) {
      out.append(bytes.substr(i, length));
      i += length;
      continue;
    }
    char escaped[8];
    std::snprintf(escaped, sizeof escaped, "\\x%02X", c);
    out += escaped;
    i++;
  }
  return out;
}

}  // namespace tandem

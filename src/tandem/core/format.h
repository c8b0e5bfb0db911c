// Human-readable quantities for messages and reports.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace tandem {

// "512 bytes", "1.50 KiB", "3.25 GiB": binary units, two decimals past bytes.
std::string format_bytes(size_t bytes);

// "12.3": `decimals` digits after the point.
std::string format_fixed(double value, int decimals);

// Bytes a model sampled, safe to print: printable ASCII, newlines, tabs and well-formed UTF-8
// as they are; every other byte (ESC and the other control bytes, DEL, stray or overlong
// UTF-8) as \xNN, so that a barely trained model's sample cannot drive a terminal or put
// control bytes into a log.
std::string printable_text(std::string_view bytes);

// A word as a POSIX shell reads it back: as it is when it holds only letters, digits and
// _-+=.,/:@%, else in single quotes (a quote inside as '\''), so that a command printed for
// the user to paste runs with exactly these arguments.
std::string shell_word(std::string_view word);

}  // namespace tandem

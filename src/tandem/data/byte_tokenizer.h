// The byte tokenizer: every byte of the text is one token, so any file is valid input
// and no vocabulary file is needed. Its vocabulary is the 256 byte values.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

class ByteTokenizer {
 public:
  static constexpr int kVocabSize = 256;

  // Each byte becomes its unsigned value 0..255.
  std::vector<int32_t> encode(std::string_view text) const;
  // Inverse of encode; throws tandem::Error for an id outside 0..255, naming the id and
  // its position (a model with a larger vocabulary can sample such ids).
  std::string decode(std::span<const int32_t> tokens) const;
};

}  // namespace tandem

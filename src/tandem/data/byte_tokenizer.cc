#include "tandem/data/byte_tokenizer.h"

#include "tandem/core/error.h"

namespace tandem {

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> tokens(text.size());
  // Through unsigned char: plain char is signed on x86, and bytes >= 128 must map to
  // 128..255, not to negative ids.
  for (size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);
  return tokens;
}

std::string ByteTokenizer::decode(std::span<const int32_t> tokens) const {
  std::string text(tokens.size(), '\0');
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t id = tokens[i];
    TANDEM_CHECK(id >= 0 && id < kVocabSize, "byte tokenizer: cannot decode token id ", id,
                 " at position ", i, " (byte ids are 0..", kVocabSize - 1,
                 "); was this sequence produced with a larger vocabulary?");
    text[i] = static_cast<char>(static_cast<unsigned char>(id));
  }
  return text;
}

}  // namespace tandem

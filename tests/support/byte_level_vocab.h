// Byte-level BPE tokenizer.json files written by tests: GPT-2's bytes_to_unicode as its
// Python source builds it (an independent transcription, not tandem's table).
#pragma once

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tandem::testing {

// The byte-level spelling of `byte`, as UTF-8 (GPT-2's bs/cs/n loop).
inline std::string gpt2_byte_token(uint8_t byte) {
  std::vector<int> bs;
  for (int b = '!'; b <= '~'; ++b) bs.push_back(b);
  for (int b = 0xA1; b <= 0xAC; ++b) bs.push_back(b);
  for (int b = 0xAE; b <= 0xFF; ++b) bs.push_back(b);
  std::vector<int> cs = bs;
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    if (std::find(bs.begin(), bs.end(), b) == bs.end()) {
      bs.push_back(b);
      cs.push_back(256 + n++);
    }
  }
  const int cp = cs[std::find(bs.begin(), bs.end(), byte) - bs.begin()];
  // All code points are below U+0800: one or two UTF-8 bytes.
  if (cp < 0x80) return std::string(1, static_cast<char>(cp));
  return {static_cast<char>(0xC0 | cp >> 6), static_cast<char>(0x80 | (cp & 0x3F))};
}

// A tokenizer.json as Hugging Face writes one for byte-level BPE.
inline nlohmann::json byte_level_tokenizer(const nlohmann::json& vocab,
                                           const nlohmann::json& added = nlohmann::json::array()) {
  return {{"version", "1.0"},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
          {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
}

inline nlohmann::json added_token(int id, const std::string& content) {
  return {{"id", id}, {"content", content}, {"special", true}};
}

}  // namespace tandem::testing

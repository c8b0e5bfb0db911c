// The vocabulary of a byte-level BPE tokenizer (GPT-2 style), read from a Hugging Face
// tokenizer.json, for turning token ids back into text. Only decoding: encoding would
// need the tokenizer's pre-tokenizer regex and merges, which the training data was
// already tokenized with (tools/tokenize_bpe.py).
//
// Byte-level BPE stores every token as a string of printable characters, one per byte,
// through GPT-2's bytes_to_unicode table (byte 0x20, a space, is "Ġ"; 0x0A is "Ċ"), so a
// token may hold part of a multi-byte UTF-8 character and decoding is per byte, not per
// character.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>

namespace tandem {

class BpeVocab {
 public:
  // Reads a tokenizer.json. Throws tandem::Error naming the file when it is missing, is
  // not JSON, or is not a byte-level BPE tokenizer (model type "BPE" with a "ByteLevel"
  // decoder), saying what it is instead.
  static BpeVocab load(const std::filesystem::path& path);
  // The same from the file's text; `source` names it in errors.
  static BpeVocab parse(std::string_view json_text, const std::string& source);

  // One more than the largest id of model.vocab and added_tokens: a model trained on
  // this tokenizer's ids needs at least this vocab_size.
  int size() const { return size_; }
  // End-of-text token (an added token named <|endoftext|>), or -1 if the tokenizer has none.
  int32_t end_of_text() const { return end_of_text_; }

  // The bytes of the tokens, concatenated, as Hugging Face's ByteLevel decoder gives them
  // before it makes the result valid UTF-8: a token whose every character is in the
  // byte table stands for those bytes, any other (an added token such as "<mask>" written
  // with a plain space) for its own UTF-8. Invalid UTF-8 (a sequence cut between two
  // tokens) is returned as it is, not replaced. Throws for an id that is negative, not
  // below size(), or a hole in the vocabulary, naming the id, its position and size().
  std::string decode(std::span<const int32_t> ids) const;

 private:
  BpeVocab() = default;

  std::string source_;
  std::unordered_map<int32_t, std::string> bytes_;  // id -> the bytes it stands for
  int size_ = 0;
  int32_t end_of_text_ = -1;
};

}  // namespace tandem

// BpeVocab: decoding byte-level BPE ids against bytes worked out by hand from GPT-2's
// bytes_to_unicode table, and the message of every file it refuses.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/byte_level_vocab.h"
#include "support/test_util.h"
#include "tandem/core/file_io.h"
#include "tandem/data/bpe_vocab.h"

namespace tandem {
namespace {

using json = nlohmann::json;
using testing::added_token;
using testing::byte_level_tokenizer;
using testing::error_of;

BpeVocab parse(const json& j) { return BpeVocab::parse(j.dump(), "tok.json"); }

std::string decode(const BpeVocab& vocab, const std::vector<int32_t>& ids) {
  return vocab.decode(ids);
}

// The token strings below are GPT-2's spelling of bytes: printable Latin-1 stands for
// itself; the other bytes are U+0100 + their rank among the non-printable ones (0x00-0x20
// are ranks 0-32, so space 0x20 is U+0120 "Ġ", newline 0x0A U+010A "Ċ", tab U+0109 "ĉ";
// 0x7F-0xA0 are ranks 33-66, so 0x80 is U+0122 "Ģ", 0x98 U+013A "ĺ", 0x9F U+0141 "Ł";
// 0xAD is rank 67, U+0143 "Ń").
const json kVocab = {
    {"h", 0},  {"i", 1},  {"Ġ", 2},     {"Ċ", 3},  {"ĉ", 4},  {"Ġworld", 5}, {"Ã", 6},  {"©", 7},
    {"ðŁ", 8}, {"ĺĢ", 9}, {"ðŁĺĢ", 10}, {"Ń", 11}, {"ÿ", 12}, {"Ā", 13},     {"ġ", 14},
};

TEST(BpeVocab, DecodesByteLevelTokensToTheirBytes) {
  const BpeVocab vocab = parse(byte_level_tokenizer(kVocab));
  EXPECT_EQ(vocab.size(), 15);
  EXPECT_EQ(vocab.end_of_text(), -1);
  EXPECT_EQ(decode(vocab, {0, 1, 5}), "hi world");
  EXPECT_EQ(decode(vocab, {3, 4, 2, 3}), "\n\t \n");
  EXPECT_EQ(decode(vocab, {11, 12, 13, 14}), std::string("\xAD\xFF\x00\x7F", 4));
  EXPECT_EQ(decode(vocab, {}), "");
}

TEST(BpeVocab, JoinsAMultiByteCharacterSplitAcrossTokens) {
  const BpeVocab vocab = parse(byte_level_tokenizer(kVocab));
  // é is C3 A9: "Ã" and "©", one byte each, in two tokens.
  EXPECT_EQ(decode(vocab, {6, 7}), "\xC3\xA9");
  EXPECT_EQ(decode(vocab, {6, 7}), "é");
  // 😀 is F0 9F 98 80: in one token, and split in two.
  EXPECT_EQ(decode(vocab, {10}), "\xF0\x9F\x98\x80");
  EXPECT_EQ(decode(vocab, {8, 9}), "😀");
  // Half a character is returned as the bytes it is, not replaced.
  EXPECT_EQ(decode(vocab, {8}), "\xF0\x9F");
}

TEST(BpeVocab, AddedTokensDecodeAsHuggingFaceDoes) {
  const BpeVocab vocab =
      parse(byte_level_tokenizer(kVocab, {added_token(15, "<|endoftext|>"),
                                          added_token(16, "<mask> x"), added_token(17, "Ġx")}));
  EXPECT_EQ(vocab.size(), 18);
  EXPECT_EQ(vocab.end_of_text(), 15);
  EXPECT_EQ(decode(vocab, {0, 15, 1}), "h<|endoftext|>i");
  // A plain space is not in the byte table, so the token is its own text ...
  EXPECT_EQ(decode(vocab, {16}), "<mask> x");
  // ... while one written in byte-level characters decodes like any token.
  EXPECT_EQ(decode(vocab, {17}), " x");
}

TEST(BpeVocab, AddedTokenReplacesAModelTokenOfItsId) {
  const BpeVocab vocab =
      parse(byte_level_tokenizer(kVocab, json::array({added_token(1, "<|end_of_text|>")})));
  EXPECT_EQ(vocab.size(), 15);
  EXPECT_EQ(decode(vocab, {0, 1}), "h<|end_of_text|>");
  EXPECT_EQ(vocab.end_of_text(), 1);
}

// Every byte through GPT-2's table as its Python source builds it.
TEST(BpeVocab, EveryByteRoundTrips) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[testing::gpt2_byte_token(static_cast<uint8_t>(b))] = b;
  const BpeVocab decoder = parse(byte_level_tokenizer(vocab));
  ASSERT_EQ(decoder.size(), 256);
  std::vector<int32_t> ids(256);
  std::string expected(256, '\0');
  for (int b = 0; b < 256; ++b) {
    ids[b] = b;
    expected[b] = static_cast<char>(b);
  }
  EXPECT_EQ(decoder.decode(ids), expected);
  EXPECT_EQ(testing::gpt2_byte_token(' '), "Ġ");
  EXPECT_EQ(testing::gpt2_byte_token(0xAD), "Ń");
}

TEST(BpeVocab, AcceptsASequenceOfByteLevelAndALegacyUntypedModel) {
  json j = byte_level_tokenizer(kVocab);
  j["decoder"] = {{"type", "Sequence"}, {"decoders", {{{"type", "ByteLevel"}}}}};
  EXPECT_EQ(decode(parse(j), {0, 1}), "hi");
  j["model"].erase("type");  // tokenizers < 0.10 wrote no type; merges make it BPE
  EXPECT_EQ(decode(parse(j), {0, 1}), "hi");
}

TEST(BpeVocab, LoadsAFile) {
  testing::ScratchDir dir("bpe_vocab");
  write_file_atomic(dir / "tokenizer.json", byte_level_tokenizer(kVocab).dump(2));
  EXPECT_EQ(decode(BpeVocab::load(dir / "tokenizer.json"), {0, 1, 5}), "hi world");
}

TEST(BpeVocab, IdsOutsideTheVocabularyNameTheIdAndTheSize) {
  const BpeVocab vocab = parse(byte_level_tokenizer(kVocab));
  std::string e = error_of([&] { decode(vocab, {0, 15}); });
  EXPECT_CONTAINS(e, "tok.json: token id 15 at position 1 is outside the vocabulary of 15 ids");
  e = error_of([&] { decode(vocab, {-1}); });
  EXPECT_CONTAINS(e, "token id -1 at position 0 is outside the vocabulary of 15 ids");
  const BpeVocab holes = parse(byte_level_tokenizer({{"a", 0}, {"b", 3}}));
  EXPECT_EQ(holes.size(), 4);
  e = error_of([&] { decode(holes, {0, 2}); });
  EXPECT_CONTAINS(e, "token id 2 at position 1 is a hole in the vocabulary of 4 ids");
}

TEST(BpeVocab, MissingFileAndNotJson) {
  testing::ScratchDir dir("bpe_vocab");
  std::string e = error_of([&] { BpeVocab::load(dir / "absent.json"); });
  EXPECT_CONTAINS(e, "absent.json: no such tokenizer file");
  write_file_atomic(dir / "merges.txt", "#version: 0.2\nĠ t\n");
  e = error_of([&] { BpeVocab::load(dir / "merges.txt"); });
  EXPECT_CONTAINS(e, "merges.txt: not JSON (parse error at byte");
  EXPECT_CONTAINS(e, "byte-level BPE");
  e = error_of([&] { BpeVocab::parse("[1, 2]", "x.json"); });
  EXPECT_CONTAINS(e, "x.json: a JSON array, not a Hugging Face tokenizer.json");
  // GPT-2's vocab.json alone: token -> id, no model.
  e = error_of([&] { BpeVocab::parse(R"({"h": 0, "i": 1})", "vocab.json"); });
  EXPECT_CONTAINS(e, "vocab.json: no \"model\" object, so not a Hugging Face tokenizer.json");
  // A model's config.json has a "model" too.
  e = error_of([&] { BpeVocab::parse(R"({"model": {"n_layer": 2}})", "config.json"); });
  EXPECT_CONTAINS(e,
                  "config.json: \"model\" has no \"type\" and no \"merges\", so this is not "
                  "a Hugging Face tokenizer.json");
}

TEST(BpeVocab, RefusesTokenizersThatAreNotByteLevelBpe) {
  json j = byte_level_tokenizer(kVocab);
  j["model"]["type"] = "WordPiece";
  std::string e = error_of([&] { parse(j); });
  EXPECT_CONTAINS(e, "tok.json: the model is WordPiece, not BPE; tandem decodes byte-level BPE");

  j = byte_level_tokenizer(kVocab);
  j["decoder"] = nullptr;
  EXPECT_CONTAINS(error_of([&] { parse(j); }), "tok.json: a BPE tokenizer without a decoder");

  j["decoder"] = {{"type", "Metaspace"}, {"replacement", "▁"}};
  EXPECT_CONTAINS(error_of([&] { parse(j); }), "the decoder is Metaspace, not ByteLevel");

  // Llama 2's: byte fallback through SentencePiece pieces.
  j["decoder"] = {{"type", "Sequence"},
                  {"decoders", {{{"type", "Replace"}}, {{"type", "ByteFallback"}}}}};
  EXPECT_CONTAINS(error_of([&] { parse(j); }),
                  "the decoder is Sequence [Replace, ByteFallback], not ByteLevel");
}

TEST(BpeVocab, RefusesMalformedVocabularies) {
  EXPECT_CONTAINS(error_of([&] { parse(byte_level_tokenizer(json::object())); }),
                  "tok.json: model.vocab is object and empty");
  EXPECT_CONTAINS(error_of([&] {
                    parse(byte_level_tokenizer({{"a", "zero"}}));
                  }),
                  "tok.json: model.vocab token \"a\" has id \"zero\", expected a non-negative "
                  "integer");
  EXPECT_CONTAINS(error_of([&] {
                    parse(byte_level_tokenizer({{"a", -3}}));
                  }),
                  "model.vocab token \"a\" has id -3, outside 0..");
  EXPECT_CONTAINS(error_of([&] {
                    parse(byte_level_tokenizer({{"a", 0}, {"b", 0}}));
                  }),
                  "model.vocab gives id 0 to two tokens");
  EXPECT_CONTAINS(error_of([&] {
                    parse(byte_level_tokenizer(kVocab, json::array({{{"id", 20}}})));
                  }),
                  "tok.json: added_tokens[0] is {\"id\":20}, expected {\"id\": integer, "
                  "\"content\": string}");
  EXPECT_CONTAINS(error_of([&] {
                    parse(byte_level_tokenizer(kVocab, json::array({added_token(-1, "<pad>")})));
                  }),
                  "added token \"<pad>\" has id -1");
}

}  // namespace
}  // namespace tandem

#include "tandem/data/bpe_vocab.h"

#include <algorithm>
#include <array>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "tandem/core/error.h"
#include "tandem/core/file_io.h"

namespace tandem {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// GPT-2's bytes_to_unicode: the printable Latin-1 bytes stand for themselves and the other
// 68 (controls, space, 0x7F-0xA0, 0xAD) for U+0100 onwards in byte order, so that every
// token is a string of visible characters.
constexpr std::array<char32_t, 256> byte_to_codepoint() {
  std::array<char32_t, 256> table{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable =
        (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    table[b] = printable ? static_cast<char32_t>(b) : next++;
  }
  return table;
}
constexpr size_t kTableCodepoints = 256 + 68;

// The inverse table: -1 for a code point that stands for no byte.
constexpr std::array<int16_t, kTableCodepoints> codepoint_to_byte() {
  std::array<int16_t, kTableCodepoints> inverse{};
  for (auto& b : inverse) b = -1;
  const auto forward = byte_to_codepoint();
  for (int b = 0; b < 256; ++b) inverse[forward[b]] = static_cast<int16_t>(b);
  return inverse;
}
constexpr auto kCodepointToByte = codepoint_to_byte();
static_assert(byte_to_codepoint()[' '] == U'\u0120' && byte_to_codepoint()['\n'] == U'\u010A',
              "GPT-2 writes a space as U+0120 (Ġ) and a newline as U+010A (Ċ)");

// The next code point of UTF-8 text at `pos`, advancing it; nullopt for a malformed sequence.
std::optional<char32_t> next_codepoint(std::string_view s, size_t& pos) {
  const auto lead = static_cast<unsigned char>(s[pos]);
  int extra = 0;
  char32_t cp = 0;
  if (lead < 0x80) {
    cp = lead;
  } else if ((lead & 0xE0) == 0xC0) {
    extra = 1, cp = lead & 0x1F;
  } else if ((lead & 0xF0) == 0xE0) {
    extra = 2, cp = lead & 0x0F;
  } else if ((lead & 0xF8) == 0xF0) {
    extra = 3, cp = lead & 0x07;
  } else {
    return std::nullopt;
  }
  if (pos + extra >= s.size() && extra > 0) return std::nullopt;
  for (int i = 1; i <= extra; ++i) {
    const auto c = static_cast<unsigned char>(s[pos + i]);
    if ((c & 0xC0) != 0x80) return std::nullopt;
    cp = cp << 6 | (c & 0x3F);
  }
  pos += 1 + extra;
  return cp;
}

// What Hugging Face's ByteLevel decoder makes of one token: the bytes its characters stand
// for when every one is in the table, else the token's own UTF-8 (added tokens written
// as plain text, like "<mask>" after a real space).
std::string token_bytes(std::string_view token) {
  std::string bytes;
  bytes.reserve(token.size());
  for (size_t pos = 0; pos < token.size();) {
    const std::optional<char32_t> cp = next_codepoint(token, pos);
    if (!cp || *cp >= kTableCodepoints || kCodepointToByte[*cp] < 0) return std::string(token);
    bytes.push_back(static_cast<char>(static_cast<unsigned char>(kCodepointToByte[*cp])));
  }
  return bytes;
}

const json* find_key(const json& object, const char* key) {
  const auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

std::string type_of(const json& node) {
  const json* type = node.is_object() ? find_key(node, "type") : nullptr;
  return type != nullptr && type->is_string() ? type->get<std::string>() : "(untyped)";
}

// "ByteLevel", or a Sequence of decoders that are all ByteLevel.
bool is_byte_level_decoder(const json& decoder) {
  const std::string type = type_of(decoder);
  if (type == "ByteLevel") return true;
  if (type != "Sequence") return false;
  const json* parts = find_key(decoder, "decoders");
  if (parts == nullptr || !parts->is_array() || parts->empty()) return false;
  for (const json& part : *parts)
    if (type_of(part) != "ByteLevel") return false;
  return true;
}

std::string describe_decoder(const json& decoder) {
  std::string text = type_of(decoder);
  const json* parts = decoder.is_object() ? find_key(decoder, "decoders") : nullptr;
  if (text == "Sequence" && parts != nullptr && parts->is_array()) {
    text += " [";
    for (size_t i = 0; i < parts->size(); ++i) text += (i ? ", " : "") + type_of((*parts)[i]);
    text += "]";
  }
  return text;
}

constexpr const char* kWhatIsNeeded =
    "tandem decodes byte-level BPE tokenizers: model type \"BPE\" with a \"ByteLevel\" decoder, "
    "as GPT-2's tokenizer.json (tools/tokenize_bpe.py writes one next to the shards)";

// An id as stored in the file: an integer in [0, INT32_MAX) so that size() fits an int.
int32_t read_id(const json& value, const std::string& source, const std::string& where) {
  TANDEM_CHECK(value.is_number_integer(), source, ": ", where, " has id ", value.dump(),
               ", expected a non-negative integer");
  const int64_t id = value.get<int64_t>();
  TANDEM_CHECK(id >= 0 && id < std::numeric_limits<int32_t>::max(), source, ": ", where, " has id ",
               id, ", outside 0..", std::numeric_limits<int32_t>::max() - 1);
  return static_cast<int32_t>(id);
}

}  // namespace

BpeVocab BpeVocab::load(const fs::path& path) {
  const std::string name = path.string();
  std::error_code ec;
  TANDEM_CHECK(fs::exists(path, ec), name,
               ": no such tokenizer file; pass the tokenizer.json the training shards were made "
               "with (tools/tokenize_bpe.py writes one next to them)");
  return parse(read_file_text(path), name);
}

BpeVocab BpeVocab::parse(std::string_view json_text, const std::string& source) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::parse_error& e) {
    fail(source, ": not JSON (parse error at byte ", e.byte, "); ", kWhatIsNeeded);
  }
  TANDEM_CHECK(root.is_object(), source, ": a JSON ", root.type_name(),
               ", not a Hugging Face tokenizer.json; ", kWhatIsNeeded);
  const json* model = find_key(root, "model");
  TANDEM_CHECK(model != nullptr && model->is_object(), source,
               ": no \"model\" object, so not a Hugging Face tokenizer.json (a vocab.json or "
               "tokenizer_config.json?); ",
               kWhatIsNeeded);
  // Files written before tokenizers 0.10 leave out the model's type; a BPE model is the one
  // with merges.
  const json* model_type = find_key(*model, "type");
  TANDEM_CHECK(model_type != nullptr || find_key(*model, "merges") != nullptr, source,
               ": \"model\" has no \"type\" and no \"merges\", so this is not a Hugging Face "
               "tokenizer.json (a model's config?); ",
               kWhatIsNeeded);
  const std::string type = model_type == nullptr ? "BPE" : type_of(*model);
  TANDEM_CHECK(type == "BPE", source, ": the model is ", type, ", not BPE; ", kWhatIsNeeded);
  const json* decoder = find_key(root, "decoder");
  TANDEM_CHECK(decoder != nullptr && !decoder->is_null(), source,
               ": a BPE tokenizer without a decoder, so its tokens are not byte-level; ",
               kWhatIsNeeded);
  TANDEM_CHECK(is_byte_level_decoder(*decoder), source, ": the decoder is ",
               describe_decoder(*decoder), ", not ByteLevel (a SentencePiece-style tokenizer?); ",
               kWhatIsNeeded);

  BpeVocab vocab;
  vocab.source_ = source;
  int64_t max_id = -1;
  const json* entries = find_key(*model, "vocab");
  TANDEM_CHECK(entries != nullptr && entries->is_object() && !entries->empty(), source,
               ": model.vocab is ", entries == nullptr ? "missing" : entries->type_name(),
               entries != nullptr && entries->is_object() ? " and empty" : "",
               "; expected an object of token -> id");
  for (const auto& [token, value] : entries->items()) {
    const int32_t id = read_id(value, source, cat("model.vocab token \"", token, "\""));
    const auto [it, inserted] = vocab.bytes_.emplace(id, token_bytes(token));
    TANDEM_CHECK(inserted, source, ": model.vocab gives id ", id, " to two tokens (\"", token,
                 "\" and another); the file is corrupt");
    max_id = std::max<int64_t>(max_id, id);
  }
  // Added (special) tokens come after the model's own, or replace an id as in Hugging Face,
  // whose id_to_token looks at them first.
  if (const json* added = find_key(root, "added_tokens"); added != nullptr && !added->is_null()) {
    TANDEM_CHECK(added->is_array(), source, ": added_tokens is a ", added->type_name(),
                 ", expected an array of {\"id\", \"content\"}");
    for (size_t i = 0; i < added->size(); ++i) {
      const json& entry = (*added)[i];
      const json* content = entry.is_object() ? find_key(entry, "content") : nullptr;
      const json* id_value = entry.is_object() ? find_key(entry, "id") : nullptr;
      TANDEM_CHECK(content != nullptr && content->is_string() && id_value != nullptr, source,
                   ": added_tokens[", i, "] is ", entry.dump(),
                   ", expected {\"id\": integer, \"content\": string}");
      const std::string text = content->get<std::string>();
      const int32_t id = read_id(*id_value, source, cat("added token \"", text, "\""));
      vocab.bytes_[id] = token_bytes(text);
      max_id = std::max<int64_t>(max_id, id);
      if (vocab.end_of_text_ < 0 &&
          (text == "<|endoftext|>" || text == "<|end_of_text|>" || text == "</s>"))
        vocab.end_of_text_ = id;
    }
  }
  vocab.size_ = static_cast<int>(max_id + 1);
  return vocab;
}

std::string BpeVocab::decode(std::span<const int32_t> ids) const {
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    TANDEM_CHECK(id >= 0 && id < size_, source_, ": token id ", id, " at position ", i,
                 " is outside the vocabulary of ", size_, " ids (0..", size_ - 1,
                 "); was the model trained on shards of another tokenizer?");
    const auto it = bytes_.find(id);
    TANDEM_CHECK(it != bytes_.end(), source_, ": token id ", id, " at position ", i,
                 " is a hole in the vocabulary of ", size_,
                 " ids (no token in model.vocab or added_tokens has it)");
    text += it->second;
  }
  return text;
}

}  // namespace tandem

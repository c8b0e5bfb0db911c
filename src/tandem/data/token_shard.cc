#include "tandem/data/token_shard.h"

#include <algorithm>
#include <array>
#include <limits>

#include "tandem/core/error.h"
#include "tandem/core/file_io.h"

namespace tandem {
namespace {

// Tokens are converted through a fixed-size byte buffer so that a multi-gigabyte shard
// never needs a second full-size copy in memory.
constexpr size_t kChunkTokens = size_t{1} << 20;

// The format is little-endian whatever the host, so bytes are assembled explicitly.
uint32_t load_le32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}
uint16_t load_le16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }
void store_le32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void store_le16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}

}  // namespace

std::vector<int32_t> read_token_shard(const std::filesystem::path& path) {
  const std::string name = path.string();
  File file(path, "rb");
  const uint64_t file_bytes = file.size();
  TANDEM_CHECK(file_bytes >= kShardHeaderBytes, name, ": file is ", file_bytes,
               " bytes, shorter than the ", kShardHeaderBytes,
               "-byte header of an llm.c token shard; is this a token shard? (raw text files "
               "must not end in .bin)");

  std::array<uint8_t, kShardHeaderBytes> header_bytes;
  file.read_exact(header_bytes.data(), header_bytes.size());
  const auto header = [&](int i) { return static_cast<int32_t>(load_le32(&header_bytes[4 * i])); };
  const int32_t magic = header(0);
  const int32_t version = header(1);
  const int32_t count = header(2);

  size_t token_bytes = 0;
  if (magic == kShardMagicUint16) {
    TANDEM_CHECK(version == kShardVersionUint16, name, ": version ", version, " for magic ", magic,
                 " (expected ", kShardVersionUint16,
                 " for an llm.c uint16 token shard); the file may be corrupt or from a newer "
                 "format");
    token_bytes = 2;
  } else if (magic == kShardMagicUint32) {
    TANDEM_CHECK(version == kShardVersionUint32, name, ": version ", version, " for magic ", magic,
                 " (expected ", kShardVersionUint32,
                 " for a uint32 token shard); the file may be corrupt or from a newer format");
    token_bytes = 4;
  } else {
    fail(name, ": bad magic ", magic, " (expected ", kShardMagicUint16,
         " for an llm.c uint16 token shard or ", kShardMagicUint32,
         " for uint32); is this a token shard? (raw text files must not end in .bin)");
  }
  TANDEM_CHECK(count >= 0, name, ": negative token count ", count,
               " in the header; the file is corrupt");

  const uint64_t expected_body = static_cast<uint64_t>(count) * token_bytes;
  const uint64_t actual_body = file_bytes - kShardHeaderBytes;
  TANDEM_CHECK(actual_body >= expected_body, name, ": truncated body: the header says ", count,
               " tokens (", expected_body, " bytes) but only ", actual_body,
               " bytes follow the header; was the file cut short while copying or writing?");
  TANDEM_CHECK(actual_body == expected_body, name, ": ", actual_body - expected_body,
               " trailing bytes: the header says ", count, " tokens (", expected_body,
               " bytes) but ", actual_body,
               " bytes follow the header; is the token count in the header wrong?");

  std::vector<int32_t> tokens(static_cast<size_t>(count));
  std::vector<uint8_t> buffer(std::min(tokens.size(), kChunkTokens) * token_bytes);
  for (size_t begin = 0; begin < tokens.size(); begin += kChunkTokens) {
    const size_t n = std::min(kChunkTokens, tokens.size() - begin);
    file.read_exact(buffer.data(), n * token_bytes);
    if (token_bytes == 2) {
      for (size_t i = 0; i < n; ++i) tokens[begin + i] = load_le16(&buffer[2 * i]);
    } else {
      for (size_t i = 0; i < n; ++i) {
        const uint32_t token = load_le32(&buffer[4 * i]);
        TANDEM_CHECK(token <= static_cast<uint32_t>(std::numeric_limits<int32_t>::max()), name,
                     ": token ", token, " at position ", begin + i,
                     " exceeds the largest supported token id ",
                     std::numeric_limits<int32_t>::max(), "; the file may be corrupt");
        tokens[begin + i] = static_cast<int32_t>(token);
      }
    }
  }
  return tokens;
}

struct TokenShardWriter::Impl {
  Impl(const std::filesystem::path& path, bool uint16, uint64_t tokens)
      : name(path.string()), is_uint16(uint16), count(tokens), file(path) {}
  std::string name;
  bool is_uint16;
  uint64_t count, written = 0;
  AtomicFileWriter file;
  std::vector<uint8_t> buffer;
};

TokenShardWriter::TokenShardWriter(const std::filesystem::path& path, ShardTokenType type,
                                   uint64_t count) {
  const bool is_uint16 = type == ShardTokenType::kUint16;
  TANDEM_CHECK(count <= static_cast<uint64_t>(std::numeric_limits<int32_t>::max()), path.string(),
               ": ", count, " tokens do not fit the int32 count of a shard header (at most ",
               std::numeric_limits<int32_t>::max(), "); split the data into several shards");
  impl_ = std::make_unique<Impl>(path, is_uint16, count);
  std::array<uint8_t, kShardHeaderBytes> header{};
  store_le32(&header[0], static_cast<uint32_t>(is_uint16 ? kShardMagicUint16 : kShardMagicUint32));
  store_le32(&header[4],
             static_cast<uint32_t>(is_uint16 ? kShardVersionUint16 : kShardVersionUint32));
  store_le32(&header[8], static_cast<uint32_t>(count));
  impl_->file.write(header.data(), header.size());
}

TokenShardWriter::~TokenShardWriter() = default;

void TokenShardWriter::append(std::span<const int32_t> tokens) {
  Impl& w = *impl_;
  TANDEM_CHECK(w.written + tokens.size() <= w.count, w.name, ": more than the ", w.count,
               " tokens its header counts");
  const size_t token_bytes = w.is_uint16 ? 2 : 4;
  for (size_t begin = 0; begin < tokens.size(); begin += kChunkTokens) {
    const size_t n = std::min(kChunkTokens, tokens.size() - begin);
    w.buffer.resize(n * token_bytes);
    for (size_t i = 0; i < n; ++i) {
      const int32_t token = tokens[begin + i];
      const uint64_t at = w.written + begin + i;
      TANDEM_CHECK(token >= 0, w.name, ": cannot write negative token ", token, " at position ",
                   at);
      TANDEM_CHECK(!w.is_uint16 || token <= std::numeric_limits<uint16_t>::max(), w.name,
                   ": token ", token, " at position ", at,
                   " does not fit a uint16 shard (max 65535); write a uint32 shard instead");
      if (w.is_uint16)
        store_le16(&w.buffer[2 * i], static_cast<uint16_t>(token));
      else
        store_le32(&w.buffer[4 * i], static_cast<uint32_t>(token));
    }
    w.file.write(w.buffer.data(), n * token_bytes);
  }
  w.written += tokens.size();
}

void TokenShardWriter::commit() {
  TANDEM_CHECK(impl_->written == impl_->count, impl_->name, ": ", impl_->written,
               " tokens written, but its header counts ", impl_->count);
  impl_->file.commit();
}

void write_token_shard(const std::filesystem::path& path, std::span<const int32_t> tokens,
                       ShardTokenType type) {
  const std::string name = path.string();
  const bool is_uint16 = type == ShardTokenType::kUint16;
  // Validated before the writer exists, so a bad token leaves no temporary file behind.
  for (size_t i = 0; i < tokens.size(); ++i) {
    TANDEM_CHECK(tokens[i] >= 0, name, ": cannot write negative token ", tokens[i], " at position ",
                 i);
    TANDEM_CHECK(!is_uint16 || tokens[i] <= std::numeric_limits<uint16_t>::max(), name, ": token ",
                 tokens[i], " at position ", i,
                 " does not fit a uint16 shard (max 65535); write a uint32 shard instead");
  }
  TokenShardWriter writer(path, type, tokens.size());
  writer.append(tokens);
  writer.commit();
}

}  // namespace tandem

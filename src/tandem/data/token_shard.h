// llm.c token shards, the format of llm.c's and nanoGPT-style data preparation scripts:
// a header of 256 little-endian int32 ([0] magic, [1] version, [2] token count, the rest
// zero) followed by the tokens as little-endian unsigned integers.
//   magic 20240520, version 1: uint16 tokens (vocabularies up to 65536, e.g. GPT-2)
//   magic 20240801, version 7: uint32 tokens (larger vocabularies)
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <vector>

namespace tandem {

enum class ShardTokenType { kUint16, kUint32 };

inline constexpr int32_t kShardMagicUint16 = 20240520;
inline constexpr int32_t kShardVersionUint16 = 1;
inline constexpr int32_t kShardMagicUint32 = 20240801;
inline constexpr int32_t kShardVersionUint32 = 7;
inline constexpr size_t kShardHeaderInts = 256;
inline constexpr size_t kShardHeaderBytes = kShardHeaderInts * sizeof(int32_t);

// Reads a whole shard. Throws tandem::Error naming the file for anything that is not
// exactly a valid shard: short file, unknown magic, version not matching the magic, a
// body shorter or longer than the header's token count says, or a uint32 token above
// INT32_MAX (tandem's token ids are int32).
std::vector<int32_t> read_token_shard(const std::filesystem::path& path);

// Writes a shard atomically (a crash leaves the old file or the new one). Throws before
// writing anything if a token is negative or does not fit `type`.
void write_token_shard(const std::filesystem::path& path, std::span<const int32_t> tokens,
                       ShardTokenType type);

// A shard written in pieces, for data too large to hold whole: the token count is given up
// front (the header comes first); the file appears, complete, only at commit(), which
// checks that exactly that many tokens came. A bad token throws naming its position, and
// the writer, destroyed uncommitted, leaves nothing behind.
class TokenShardWriter {
 public:
  TokenShardWriter(const std::filesystem::path& path, ShardTokenType type, uint64_t count);
  ~TokenShardWriter();
  TokenShardWriter(const TokenShardWriter&) = delete;
  TokenShardWriter& operator=(const TokenShardWriter&) = delete;
  void append(std::span<const int32_t> tokens);
  void commit();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem

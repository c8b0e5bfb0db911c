#include "tandem/data/loss_mask.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "tandem/core/error.h"
#include "tandem/core/file_io.h"
#include "tandem/data/token_shard.h"

namespace tandem {
namespace {

int32_t load_le32(const uint8_t* p) {
  return static_cast<int32_t>(uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 |
                              uint32_t{p[3]} << 24);
}
void store_le32(uint8_t* p, int32_t value) {
  const auto v = static_cast<uint32_t>(value);
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

}  // namespace

std::filesystem::path loss_mask_path_for(const std::filesystem::path& shard) {
  std::filesystem::path mask = shard;
  mask.replace_extension(".mask.bin");
  return mask;
}

std::vector<uint8_t> read_loss_mask(const std::filesystem::path& path, size_t expected_count) {
  const std::string name = path.string();
  File file(path, "rb");
  const uint64_t file_bytes = file.size();
  TANDEM_CHECK(file_bytes >= kShardHeaderBytes, name, ": file is ", file_bytes,
               " bytes, shorter than the ", kShardHeaderBytes,
               "-byte header of a loss mask; remake it with tools/tokenize_bpe.py");
  std::array<uint8_t, kShardHeaderBytes> header;
  file.read_exact(header.data(), header.size());
  const int32_t magic = load_le32(&header[0]), version = load_le32(&header[4]);
  const int32_t count = load_le32(&header[8]);
  TANDEM_CHECK(magic == kLossMaskMagic, name, ": bad magic ", magic, " (expected ", kLossMaskMagic,
               " for a loss mask); is this a loss mask?");
  TANDEM_CHECK(version == kLossMaskVersion, name, ": version ", version, " (expected ",
               kLossMaskVersion, "); the file may be from a newer tandem");
  TANDEM_CHECK(count >= 0 && static_cast<size_t>(count) == expected_count, name, ": masks ", count,
               " tokens but its token shard holds ", expected_count,
               "; the two were not made together: remake both with tools/tokenize_bpe.py");
  TANDEM_CHECK(file_bytes - kShardHeaderBytes == static_cast<uint64_t>(count), name, ": ",
               file_bytes - kShardHeaderBytes, " bytes follow the header, which says ", count,
               " tokens; the file is truncated or corrupt");
  std::vector<uint8_t> mask(static_cast<size_t>(count));
  file.read_exact(mask.data(), mask.size());
  const auto bad = std::find_if(mask.begin(), mask.end(), [](uint8_t m) { return m > 1; });
  TANDEM_CHECK(bad == mask.end(), name, ": byte ", bad == mask.end() ? 0 : int{*bad}, " at token ",
               bad - mask.begin(), " is neither 0 nor 1; the file is corrupt");
  return mask;
}

void write_loss_mask(const std::filesystem::path& path, std::span<const uint8_t> mask) {
  TANDEM_CHECK(mask.size() <= static_cast<size_t>(INT32_MAX), path.string(), ": ", mask.size(),
               " tokens do not fit the header's int32 count");
  std::vector<uint8_t> bytes(kShardHeaderBytes + mask.size(), 0);
  store_le32(&bytes[0], kLossMaskMagic);
  store_le32(&bytes[4], kLossMaskVersion);
  store_le32(&bytes[8], static_cast<int32_t>(mask.size()));
  std::copy(mask.begin(), mask.end(), bytes.begin() + kShardHeaderBytes);
  write_file_atomic(path, bytes);
}

}  // namespace tandem

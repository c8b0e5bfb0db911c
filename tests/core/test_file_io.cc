// File's running checksum: what a checkpoint records for a file without reading it back.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "support/test_util.h"
#include "tandem/core/checksum.h"
#include "tandem/core/file_io.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

TEST(FileChecksum, WritesInPiecesGiveTheChecksumOfTheFileOnDisk) {
  const testing::ScratchDir dir("file_io");
  const fs::path path = dir.path() / "pieces.bin";
  // Pieces of every size up to past XXH3's 256-byte stripes, as a writer streams tensors.
  std::vector<unsigned char> bytes;
  {
    File out(path, "wb");
    out.checksum_writes();
    for (size_t n = 0; n < 700; n += 37) {
      std::vector<unsigned char> piece(n);
      for (size_t i = 0; i < n; i++) piece[i] = static_cast<unsigned char>(i * 131 + n);
      out.write_all(piece.data(), piece.size());
      bytes.insert(bytes.end(), piece.begin(), piece.end());
    }
    out.sync();
    EXPECT_EQ(out.bytes_written(), bytes.size());
    EXPECT_EQ(out.written_checksum(), checksum64(bytes.data(), bytes.size()));
    out.close();
    EXPECT_EQ(out.written_checksum(), checksum64_file(path));
  }
  EXPECT_EQ(fs::file_size(path), bytes.size());
}

TEST(FileChecksum, ASeekWouldBreakTheRunningChecksumAndIsRefused) {
  const testing::ScratchDir dir("file_io");
  File out(dir.path() / "ordered.bin", "wb");
  out.write_all("head");
  out.seek(0);  // allowed before checksum_writes()
  out.checksum_writes();
  out.write_all("body");
  EXPECT_CONTAINS(testing::error_of([&] { out.seek(0); }),
                  "cannot seek in a file whose writes are checksummed");
  File plain(dir.path() / "plain.bin", "wb");
  EXPECT_CONTAINS(testing::error_of([&] { (void)plain.written_checksum(); }),
                  "without checksum_writes()");
}

}  // namespace
}  // namespace tandem

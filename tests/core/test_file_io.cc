// File's running checksum (what a checkpoint records for a file without reading it back),
// its write-behind, and its observed reads (what a resume checksums as it reads).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
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

// 20 MiB in pieces that straddle the 8 MiB hand-overs: the bytes on disk and the checksum
// are those written, with the file handed to the disk twice on the way.
TEST(FileWriteBehind, TheFileHoldsWhatWasWrittenAcrossHandOvers) {
  const testing::ScratchDir dir("file_io");
  const fs::path path = dir.path() / "behind.bin";
  std::vector<unsigned char> bytes(size_t{20} << 20);
  for (size_t i = 0; i < bytes.size(); i++) bytes[i] = static_cast<unsigned char>(i * 7 + i / 4099);
  File out(path, "wb");
  out.checksum_writes();
  out.write_all("head");
  out.write_behind();
  for (size_t at = 0; at < bytes.size(); at += 3333331)
    out.write_all(bytes.data() + at, std::min<size_t>(3333331, bytes.size() - at));
  out.sync();
  out.close();
  std::vector<unsigned char> want = {'h', 'e', 'a', 'd'};
  want.insert(want.end(), bytes.begin(), bytes.end());
  EXPECT_EQ(out.written_checksum(), checksum64(want.data(), want.size()));
  EXPECT_TRUE(read_file_bytes(path) == want);
}

// read_observed and read_past hand every byte to the observer once, in order, in blocks
// of at most 4 MiB; read_observed leaves them in place.
TEST(FileObservedReads, EveryByteIsObservedOnceInOrder) {
  const testing::ScratchDir dir("file_io");
  const fs::path path = dir.path() / "observed.bin";
  std::vector<uint8_t> bytes(size_t{9} << 20);
  for (size_t i = 0; i < bytes.size(); i++) bytes[i] = static_cast<uint8_t>(i * 13 + i / 65537);
  write_file_atomic(path, bytes);
  File in(path, "rb");
  std::vector<uint8_t> seen, kept(bytes.size() - 1000);
  size_t largest = 0;
  const auto observe = [&](const void* data, size_t n) {
    const auto* b = static_cast<const uint8_t*>(data);
    seen.insert(seen.end(), b, b + n);
    largest = std::max(largest, n);
  };
  in.read_past(1000, observe);
  in.read_observed(kept.data(), kept.size(), observe);
  EXPECT_TRUE(seen == bytes);
  EXPECT_TRUE(std::equal(kept.begin(), kept.end(), bytes.begin() + 1000));
  EXPECT_LE(largest, size_t{4} << 20);
  EXPECT_CONTAINS(testing::error_of([&] { in.read_past(1, observe); }), "truncated");
}

}  // namespace
}  // namespace tandem

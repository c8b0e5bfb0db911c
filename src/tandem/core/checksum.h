// Content checksums for files tandem writes (checkpoints): XXH3-64 from libxxhash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

namespace tandem {

uint64_t checksum64(const void* data, size_t bytes);

// checksum64 of bytes given in pieces: the same value as checksum64 of their concatenation.
class Checksum64Stream {
 public:
  Checksum64Stream();
  ~Checksum64Stream();
  Checksum64Stream(const Checksum64Stream&) = delete;
  Checksum64Stream& operator=(const Checksum64Stream&) = delete;
  void update(const void* data, size_t bytes);
  uint64_t digest() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};
// Streams the file in blocks; throws tandem::Error naming the file on I/O failure.
uint64_t checksum64_file(const std::filesystem::path& path);
// 16 lowercase hex digits.
std::string checksum_hex(uint64_t checksum);

}  // namespace tandem

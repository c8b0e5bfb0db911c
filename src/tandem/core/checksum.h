// Content checksums for files tandem writes (checkpoints): XXH3-64 from libxxhash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

namespace tandem {

uint64_t checksum64(const void* data, size_t bytes);
// Streams the file in blocks; throws tandem::Error naming the file on I/O failure.
uint64_t checksum64_file(const std::filesystem::path& path);
// 16 lowercase hex digits.
std::string checksum_hex(uint64_t checksum);

}  // namespace tandem

#include "tandem/core/checksum.h"

#include <xxhash.h>

#include <memory>
#include <vector>

#include "tandem/core/error.h"
#include "tandem/core/file_io.h"

namespace tandem {

uint64_t checksum64(const void* data, size_t bytes) { return XXH3_64bits(data, bytes); }

struct Checksum64Stream::State {
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> xxh3{XXH3_createState(),
                                                                &XXH3_freeState};
};

Checksum64Stream::Checksum64Stream() : state_(std::make_unique<State>()) {
  TANDEM_CHECK(state_->xxh3 != nullptr, "out of memory creating a checksum state");
  XXH3_64bits_reset(state_->xxh3.get());
}

Checksum64Stream::~Checksum64Stream() = default;

void Checksum64Stream::update(const void* data, size_t bytes) {
  XXH3_64bits_update(state_->xxh3.get(), data, bytes);
}

uint64_t Checksum64Stream::digest() const { return XXH3_64bits_digest(state_->xxh3.get()); }

uint64_t checksum64_file(const std::filesystem::path& path) {
  Checksum64Stream checksum;
  File file(path, "rb");
  file.read_past(file.size(), [&](const void* data, size_t n) { checksum.update(data, n); });
  return checksum.digest();
}

std::string checksum_hex(uint64_t checksum) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex(16, '0');
  for (int i = 15; i >= 0; --i, checksum >>= 4) hex[i] = kDigits[checksum & 0xf];
  return hex;
}

}  // namespace tandem

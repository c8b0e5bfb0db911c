#include "tandem/core/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "tandem/core/error.h"

namespace tandem {
namespace fs = std::filesystem;

namespace {
std::string errno_text() { return std::strerror(errno); }
}  // namespace

File::File(const fs::path& path, const char* mode) : path_(path) {
  // fopen opens a directory for reading, and its "size" is then nonsense.
  std::error_code ec;
  if (fs::is_directory(path, ec)) fail(path.string(), ": is a directory; name a file");
  file_.reset(std::fopen(path.c_str(), mode));
  if (file_ == nullptr) fail(path.string(), ": cannot open (", errno_text(), ")");
}

void File::checksum_writes() { checksum_ = std::make_unique<Checksum64Stream>(); }

uint64_t File::written_checksum() const {
  TANDEM_CHECK(checksum_ != nullptr, path_.string(),
               ": written_checksum() without checksum_writes() before the writes");
  return checksum_->digest();
}

void File::read_exact(void* dst, size_t bytes) {
  const uint64_t offset = tell();
  const size_t got = std::fread(dst, 1, bytes, file_.get());
  if (got != bytes) {
    if (std::ferror(file_.get()))
      fail(path_.string(), ": read error at offset ", offset, " (", errno_text(), ")");
    fail(path_.string(), ": truncated: expected ", bytes, " bytes at offset ", offset, ", found ",
         got);
  }
}

namespace {
// What a reader reads at once: a few MiB, still in the cache when they are observed.
constexpr size_t kObservedBlock = size_t{4} << 20;
// What a writer writes before write_behind hands it to the disk.
constexpr uint64_t kWriteBehindBytes = uint64_t{8} << 20;
}  // namespace

void File::read_observed(void* dst, size_t bytes, const Observer& observe) {
  auto* to = static_cast<uint8_t*>(dst);
  for (size_t at = 0; at < bytes; at += kObservedBlock) {
    const size_t n = std::min(kObservedBlock, bytes - at);
    read_exact(to + at, n);
    observe(to + at, n);
  }
}

void File::read_past(uint64_t bytes, const Observer& observe) {
  std::vector<uint8_t> block(static_cast<size_t>(std::min<uint64_t>(bytes, kObservedBlock)));
  for (uint64_t at = 0; at < bytes; at += block.size()) {
    const auto n = static_cast<size_t>(std::min<uint64_t>(block.size(), bytes - at));
    read_exact(block.data(), n);
    observe(block.data(), n);
  }
}

void File::write_all(const void* src, size_t bytes) {
  if (bytes == 0) return;
  if (std::fwrite(src, 1, bytes, file_.get()) != bytes)
    fail(path_.string(), ": write failed (", errno_text(), "); is the disk full?");
  if (checksum_) checksum_->update(src, bytes);
  bytes_written_ += bytes;
  not_handed_ += bytes;
  if (handed_to_disk_ && not_handed_ >= kWriteBehindBytes) {
    not_handed_ = 0;
    flush();
    const uint64_t end = tell();
    // Starts the write-out without waiting for it; sync() waits (and reports its errors).
    (void)::sync_file_range(fileno(file_.get()), static_cast<off_t>(*handed_to_disk_),
                            static_cast<off_t>(end - *handed_to_disk_), SYNC_FILE_RANGE_WRITE);
    handed_to_disk_ = end;
  }
}

void File::write_behind() {
  handed_to_disk_ = tell();
  not_handed_ = 0;
}

void File::seek(uint64_t offset) {
  TANDEM_CHECK(checksum_ == nullptr, path_.string(),
               ": cannot seek in a file whose writes are checksummed (it is written in order)");
  if (fseeko(file_.get(), static_cast<off_t>(offset), SEEK_SET) != 0)
    fail(path_.string(), ": cannot seek to offset ", offset, " (", errno_text(), ")");
}

uint64_t File::tell() {
  const off_t pos = ftello(file_.get());
  if (pos < 0) fail(path_.string(), ": cannot tell position (", errno_text(), ")");
  return static_cast<uint64_t>(pos);
}

uint64_t File::size() {
  const uint64_t here = tell();
  if (fseeko(file_.get(), 0, SEEK_END) != 0)
    fail(path_.string(), ": cannot seek to end (", errno_text(), ")");
  const uint64_t end = tell();
  seek(here);
  return end;
}

void File::flush() {
  if (std::fflush(file_.get()) != 0)
    fail(path_.string(), ": flush failed (", errno_text(), "); is the disk full?");
}

void File::sync() {
  flush();
  if (::fsync(fileno(file_.get())) != 0)
    fail(path_.string(), ": fsync failed (", errno_text(), ")");
}

void File::close() {
  if (file_ == nullptr) return;
  FILE* f = file_.release();
  if (std::fclose(f) != 0)
    fail(path_.string(), ": close failed (", errno_text(), "); is the disk full?");
}

std::vector<uint8_t> read_file_bytes(const fs::path& path) {
  File file(path, "rb");
  std::vector<uint8_t> bytes(file.size());
  file.read_exact(bytes.data(), bytes.size());
  return bytes;
}

std::string read_file_text(const fs::path& path) {
  File file(path, "rb");
  std::string text(file.size(), '\0');
  file.read_exact(text.data(), text.size());
  return text;
}

namespace {
fs::path temp_path_for(const fs::path& path) {
  return fs::path(path.string() + ".tmp-" + std::to_string(::getpid()));
}
}  // namespace

AtomicFileWriter::AtomicFileWriter(fs::path path)
    : path_(std::move(path)), temp_path_(temp_path_for(path_)), file_(temp_path_, "wb") {}

AtomicFileWriter::~AtomicFileWriter() {
  if (!committed_) {
    // Unlinking an open file is fine on POSIX; File's destructor closes it after.
    std::error_code ignored;
    fs::remove(temp_path_, ignored);
  }
}

void AtomicFileWriter::commit() {
  file_.sync();
  file_.close();
  if (std::rename(temp_path_.c_str(), path_.c_str()) != 0)
    fail(path_.string(), ": cannot rename ", temp_path_.string(), " into place (", errno_text(),
         ")");
  committed_ = true;
  const fs::path dir = path_.has_parent_path() ? path_.parent_path() : fs::path(".");
  sync_directory(dir);
}

void write_file_atomic(const fs::path& path, std::span<const uint8_t> bytes) {
  AtomicFileWriter writer(path);
  writer.write(bytes.data(), bytes.size());
  writer.commit();
}

void write_file_atomic(const fs::path& path, std::string_view text) {
  AtomicFileWriter writer(path);
  writer.write(text);
  writer.commit();
}

void sync_directory(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) fail(dir.string(), ": cannot open directory to sync (", errno_text(), ")");
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) fail(dir.string(), ": fsync of directory failed (", errno_text(), ")");
}

}  // namespace tandem

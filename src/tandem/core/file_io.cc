#include "tandem/core/file_io.h"

#include <fcntl.h>
#include <unistd.h>

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
  file_ = std::fopen(path.c_str(), mode);
  if (file_ == nullptr) fail(path.string(), ": cannot open (", errno_text(), ")");
}

File::~File() {
  if (file_ != nullptr) std::fclose(file_);
}

File::File(File&& other) noexcept
    : path_(std::move(other.path_)),
      file_(other.file_),
      checksum_(std::move(other.checksum_)),
      bytes_written_(other.bytes_written_) {
  other.file_ = nullptr;
}

File& File::operator=(File&& other) noexcept {
  if (this != &other) {
    if (file_ != nullptr) std::fclose(file_);
    path_ = std::move(other.path_);
    file_ = other.file_;
    checksum_ = std::move(other.checksum_);
    bytes_written_ = other.bytes_written_;
    other.file_ = nullptr;
  }
  return *this;
}

void File::checksum_writes() { checksum_ = std::make_unique<Checksum64Stream>(); }

uint64_t File::written_checksum() const {
  TANDEM_CHECK(checksum_ != nullptr, path_.string(),
               ": written_checksum() without checksum_writes() before the writes");
  return checksum_->digest();
}

void File::read_exact(void* dst, size_t bytes) {
  const uint64_t offset = tell();
  const size_t got = std::fread(dst, 1, bytes, file_);
  if (got != bytes) {
    if (std::ferror(file_))
      fail(path_.string(), ": read error at offset ", offset, " (", errno_text(), ")");
    fail(path_.string(), ": truncated: expected ", bytes, " bytes at offset ", offset, ", found ",
         got);
  }
}

void File::write_all(const void* src, size_t bytes) {
  if (bytes == 0) return;
  if (std::fwrite(src, 1, bytes, file_) != bytes)
    fail(path_.string(), ": write failed (", errno_text(), "); is the disk full?");
  if (checksum_) checksum_->update(src, bytes);
  bytes_written_ += bytes;
}

void File::seek(uint64_t offset) {
  TANDEM_CHECK(checksum_ == nullptr, path_.string(),
               ": cannot seek in a file whose writes are checksummed (it is written in order)");
  if (fseeko(file_, static_cast<off_t>(offset), SEEK_SET) != 0)
    fail(path_.string(), ": cannot seek to offset ", offset, " (", errno_text(), ")");
}

uint64_t File::tell() {
  const off_t pos = ftello(file_);
  if (pos < 0) fail(path_.string(), ": cannot tell position (", errno_text(), ")");
  return static_cast<uint64_t>(pos);
}

uint64_t File::size() {
  const uint64_t here = tell();
  if (fseeko(file_, 0, SEEK_END) != 0)
    fail(path_.string(), ": cannot seek to end (", errno_text(), ")");
  const uint64_t end = tell();
  seek(here);
  return end;
}

void File::flush() {
  if (std::fflush(file_) != 0)
    fail(path_.string(), ": flush failed (", errno_text(), "); is the disk full?");
}

void File::sync() {
  flush();
  if (::fsync(fileno(file_)) != 0) fail(path_.string(), ": fsync failed (", errno_text(), ")");
}

void File::close() {
  if (file_ == nullptr) return;
  FILE* f = file_;
  file_ = nullptr;
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

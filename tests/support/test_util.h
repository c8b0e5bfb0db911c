// Helpers shared by the end-to-end tests: a scratch directory, running the `tandem`
// binary, and a tiny run configuration that trains in well under a second.
#pragma once

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "tandem/core/error.h"
#include "tandem/core/file_io.h"
#include "tandem/core/half.h"
#include "tandem/core/rng.h"
#include "tandem/core/scratch_dir.h"

// Where the build put the repository and the tandem binary (CMakeLists.txt); only the
// last resort of source_dir() and tandem_binary() below.
#ifndef TANDEM_SOURCE_DIR
#define TANDEM_SOURCE_DIR ""
#endif
#ifndef TANDEM_BINARY
#define TANDEM_BINARY ""
#endif

namespace tandem::testing {

// The repository (for data/, configs/, tests/fixtures/), found at run time so that a test
// built on one machine runs from a checkout elsewhere (the GPU machine gets the tree at
// another path): $TANDEM_SOURCE_DIR, else the first directory above the test binary that
// holds data/tinyshakespeare.txt, else the directory the test was built from.
// The first directory from `start` upwards that looks like the repository (empty if none).
inline std::filesystem::path repository_above(std::filesystem::path start) {
  namespace fs = std::filesystem;
  for (fs::path dir = std::move(start); !dir.empty(); dir = dir.parent_path()) {
    if (fs::exists(dir / "data" / "tinyshakespeare.txt") && fs::exists(dir / "CMakeLists.txt"))
      return dir;
    if (dir == dir.root_path()) break;
  }
  return {};
}
inline std::filesystem::path source_dir() {
  namespace fs = std::filesystem;
  if (const char* env = std::getenv("TANDEM_SOURCE_DIR"); env != nullptr && *env != '\0')
    return env;
  std::error_code ec;
  const fs::path binary = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    if (fs::path found = repository_above(binary.parent_path()); !found.empty()) return found;
  }
  return TANDEM_SOURCE_DIR;
}

// The `tandem` binary: $TANDEM_BINARY, else the one beside the test binary, else where the
// build put it.
inline std::filesystem::path tandem_binary() {
  namespace fs = std::filesystem;
  if (const char* env = std::getenv("TANDEM_BINARY"); env != nullptr && *env != '\0') return env;
  std::error_code ec;
  const fs::path beside = fs::read_symlink("/proc/self/exe", ec).parent_path() / "tandem";
  if (!ec && fs::exists(beside)) return beside;
  return TANDEM_BINARY;
}

// gtest's EXPECT_THAT/HasSubstr live in gmock, which the tests do not link.
inline ::testing::AssertionResult contains(const char* text_expr, const char* part_expr,
                                           const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << text_expr << " does not contain " << part_expr
                                       << "\n  text: " << text << "\n  part: " << part;
}
#define EXPECT_CONTAINS(text, part) EXPECT_PRED_FORMAT2(::tandem::testing::contains, text, part)

// The message of the tandem::Error that `fn` throws; fails the test if it throws nothing.
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a tandem::Error";
  return "";
}

// A fresh directory under the system temp dir, removed with everything in it.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& tag)
      : dir_("tandem_" + tag + "_" + std::to_string(::getpid()) + "_" +
             std::to_string(counter()++)) {
    std::filesystem::create_directories(dir_.path());
  }
  const std::filesystem::path& path() const { return dir_.path(); }
  std::filesystem::path operator/(const std::string& name) const { return dir_.path() / name; }

 private:
  static int& counter() {
    static int n = 0;
    return n;
  }
  tandem::ScratchDir dir_;
};

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs a shell command line, capturing stdout and stderr.
inline CommandResult run_command(const std::string& command) {
  CommandResult result;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) result.output.append(buffer, n);
  const int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

// A value from a mix of regimes: zeros, denormals, tiny, ordinary, huge, and (for
// gradients) NaN and infinities.
inline float nasty_value(Rng& rng, bool allow_nonfinite) {
  const uint64_t kind = rng.next_u64() % 16;
  const float sign = rng.uniform() < 0.5f ? -1.0f : 1.0f;
  switch (kind) {
    case 0:
      return 0.0f * sign;
    case 1:
      return sign * std::numeric_limits<float>::denorm_min() *
             static_cast<float>(rng.next_u64() % 1000);
    case 2:
      return sign * 1e-30f * rng.uniform();
    case 3:
      return sign * 1e30f * rng.uniform();
    case 4:
      return sign * 3.0e38f;
    case 5:
      return allow_nonfinite ? std::numeric_limits<float>::quiet_NaN() : 1.0f;
    case 6:
      return allow_nonfinite ? sign * std::numeric_limits<float>::infinity() : -1.0f;
    default:
      return rng.normal() * (kind < 10 ? 1e-3f : 1.0f);
  }
}

// Writes past `bytes` fail with EFBIG (SIGXFSZ ignored) while an instance lives: a full
// disk without mounting one.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    previous_handler_ = std::signal(SIGXFSZ, SIG_IGN);
    getrlimit(RLIMIT_FSIZE, &previous_);
    rlimit limit = previous_;
    limit.rlim_cur = bytes;
    EXPECT_EQ(setrlimit(RLIMIT_FSIZE, &limit), 0);
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &previous_);
    std::signal(SIGXFSZ, previous_handler_);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;

 private:
  rlimit previous_{};
  void (*previous_handler_)(int) = nullptr;
};

// The names in a directory (not recursive).
inline std::set<std::string> entries(const std::filesystem::path& dir) {
  std::set<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    names.insert(e.path().filename().string());
  return names;
}

// n samples of scale * N(0, 1) from a seed.
inline std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = scale * rng.normal();
  return v;
}

// x stored as Elem (float, or Bf16 rounded once).
template <typename Elem>
std::vector<Elem> stored(const std::vector<float>& x) {
  std::vector<Elem> out(x.size());
  for (size_t i = 0; i < x.size(); i++) out[i] = from_float<Elem>(x[i]);
  return out;
}

// n NaNs as Elem: an output a kernel never writes stays NaN and fails any comparison.
template <typename Elem>
std::vector<Elem> nans(size_t n) {
  return stored<Elem>(std::vector<float>(n, std::numeric_limits<float>::quiet_NaN()));
}

}  // namespace tandem::testing

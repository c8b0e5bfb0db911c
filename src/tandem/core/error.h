// Errors: one exception type whose message names what was wrong and how to fix it.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace tandem {

// Every user-facing failure is a tandem::Error. Its message is one line that names the
// object (file, config key, tensor) and the problem, ideally with a hint, e.g.
//   "data/x.bin: bad magic 1234 (expected 20240520); is this an llm.c token shard?"
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An error that every rank of a job throws at the same point, in step (comm/agreement.h):
// no rank is left waiting in a collective, so the job can end with a clean finalize instead
// of an abort. `own`: whether this rank met it itself, or only stops with the rank that did
// (whose message says why). `rank` ("rank 1 of 2: ") precedes the message in what(), for
// whoever prints one rank's error; message() is without it, for whoever compares the ranks'.
class ErrorOnEveryRank : public Error {
 public:
  explicit ErrorOnEveryRank(const std::string& message, bool own = true,
                            const std::string& rank = "")
      : Error(rank + message), message_(message), own_(own) {}
  bool own() const { return own_; }
  const std::string& message() const { return message_; }

 private:
  std::string message_;
  bool own_;
};

// Concatenates any streamable values into one string.
template <typename... Parts>
std::string cat(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return out.str();
}

template <typename... Parts>
[[noreturn]] void fail(Parts&&... parts) {
  throw Error(cat(std::forward<Parts>(parts)...));
}

}  // namespace tandem

// Checks an invariant that bad input can break; throws tandem::Error with the message.
#define TANDEM_CHECK(cond, ...)               \
  do {                                        \
    if (!(cond)) ::tandem::fail(__VA_ARGS__); \
  } while (0)

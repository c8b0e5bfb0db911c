#include "tandem/ckpt/background_writer.h"

#include <exception>
#include <utility>

#include "tandem/core/error.h"
#include "tandem/core/timer.h"

namespace tandem {

BackgroundCheckpointWriter::~BackgroundCheckpointWriter() {
  if (thread_.joinable()) thread_.join();
}

void BackgroundCheckpointWriter::start(int64_t step, std::function<std::filesystem::path()> write) {
  TANDEM_CHECK(!in_flight(), "checkpoint ", step, ": the checkpoint of step ", outcome_.step,
               " is still being written (wait for it first)");
  done_ = false;
  outcome_ = Outcome{.step = step};
  thread_ = std::thread([this, write = std::move(write)] {
    Stopwatch watch;
    try {
      outcome_.path = write();
    } catch (const std::exception& e) {
      outcome_.error = e.what();
    } catch (...) {
      outcome_.error = "unknown error";
    }
    outcome_.flush_ms = watch.millis();
    done_ = true;
  });
}

std::optional<BackgroundCheckpointWriter::Outcome> BackgroundCheckpointWriter::poll() {
  if (!finished()) return std::nullopt;
  return wait();
}

std::optional<BackgroundCheckpointWriter::Outcome> BackgroundCheckpointWriter::wait() {
  if (!in_flight()) return std::nullopt;
  thread_.join();
  return std::exchange(outcome_, Outcome{.step = outcome_.step});
}

}  // namespace tandem

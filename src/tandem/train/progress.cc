#include "tandem/train/progress.h"

#include <unistd.h>

#include <cmath>

#include "tandem/core/error.h"

namespace tandem {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<int64_t>(std::lround(seconds));
  char buffer[32];
  if (s >= 3600)
    std::snprintf(buffer, sizeof buffer, "%ldh%02ldm", static_cast<long>(s / 3600),
                  static_cast<long>(s % 3600 / 60));
  else if (s >= 60)
    std::snprintf(buffer, sizeof buffer, "%ldm%02lds", static_cast<long>(s / 60),
                  static_cast<long>(s % 60));
  else
    std::snprintf(buffer, sizeof buffer, "%lds", static_cast<long>(s));
  return buffer;
}

ProgressLine::ProgressLine(int64_t total_steps, int64_t log_interval, bool enabled, std::FILE* out)
    : total_steps_(total_steps),
      log_interval_(log_interval),
      enabled_(enabled),
      interactive_(enabled && ::isatty(fileno(out)) != 0),
      out_(out) {}

void ProgressLine::update(int64_t step, float loss, double tokens_per_s, double ms_per_step) {
  if (!enabled_) return;
  // The ETA uses the average time per step since the first update (evaluations and
  // checkpoints included), which is steadier than the last step's time.
  if (first_step_ < 0) {
    first_step_ = step;
    since_first_update_.reset();
  }
  const bool last = step == total_steps_;
  if (!interactive_ && !last && (log_interval_ <= 0 || step % log_interval_ != 0)) return;
  // A live line redrawn more than ~10 times a second only costs time.
  if (interactive_ && !last && line_open_ && since_last_print_.seconds() < 0.1) return;
  since_last_print_.reset();
  const double seconds_per_step =
      step > first_step_ ? since_first_update_.seconds() / (step - first_step_) : ms_per_step / 1e3;
  const double eta = (total_steps_ - step) * seconds_per_step;
  char line[256];
  std::snprintf(line, sizeof line,
                "step %6ld/%ld | loss %.4f | %8.0f tok/s | %7.1f ms/step | ETA %s",
                static_cast<long>(step), static_cast<long>(total_steps_), loss, tokens_per_s,
                ms_per_step, format_duration(eta).c_str());
  if (interactive_) {
    std::fprintf(out_, "\r\033[K%s", line);
    line_open_ = true;
  } else {
    std::fprintf(out_, "%s\n", line);
  }
  std::fflush(out_);
}

void ProgressLine::note(const std::string& text) {
  if (!enabled_) return;
  if (line_open_) std::fprintf(out_, "\r\033[K");
  line_open_ = false;
  std::fprintf(out_, "%s\n", text.c_str());
  std::fflush(out_);
}

void ProgressLine::finish() {
  if (line_open_) std::fprintf(out_, "\n");
  line_open_ = false;
  if (enabled_) std::fflush(out_);
}

}  // namespace tandem

// Training progress for people: on a terminal one live line rewritten in place
// (step/total, loss, tokens/s, ms/step, ETA); otherwise (logs, CI) a plain line every
// log_interval steps.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "tandem/core/timer.h"

namespace tandem {

class ProgressLine {
 public:
  ProgressLine(int64_t total_steps, int64_t log_interval, bool enabled, std::FILE* out = stderr);
  // step is 1-based: the number of steps completed.
  void update(int64_t step, float loss, double tokens_per_s, double ms_per_step);
  // Prints a full line of its own (evaluation, checkpoint) without garbling the live line.
  void note(const std::string& text);
  // Ends the live line.
  void finish();

 private:
  Stopwatch since_first_update_;
  Stopwatch since_last_print_;
  int64_t first_step_ = -1;  // the step of the first update, for the ETA's average
  int64_t total_steps_;
  int64_t log_interval_;
  bool enabled_;
  bool interactive_;
  bool line_open_ = false;
  std::FILE* out_;
};

std::string format_duration(double seconds);

}  // namespace tandem

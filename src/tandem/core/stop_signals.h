// SIGINT, SIGTERM and SIGHUP as a request to stop at the next step boundary, so that a
// run told to stop (Ctrl-C, a scheduler's preemption, a closed terminal) first writes a
// checkpoint. A second signal ends the process at once, as the signal's default action
// would (an in-flight checkpoint is then abandoned as a staging directory that nothing
// reads).
//
// A signal handler can only reach static storage: the signal that arrived (a lock-free
// atomic) and the handlers to restore live in stop_signals.cc, the one place in tandem
// with process-wide mutable state. One instance at a time.
#pragma once

namespace tandem {

class StopSignals {
 public:
  // Installs the handlers (saving the previous ones).
  StopSignals();
  // Restores the previous handlers.
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The first signal that arrived since construction, 0 if none.
  static int requested();
  // "SIGTERM".
  static const char* name(int signal);
};

}  // namespace tandem

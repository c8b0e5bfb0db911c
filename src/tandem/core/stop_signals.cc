#include "tandem/core/stop_signals.h"

#include <atomic>
#include <csignal>

#include "tandem/core/error.h"

namespace tandem {
namespace {

constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};

std::atomic<int> g_requested{0};  // see the header: a handler reaches nothing else
static_assert(std::atomic<int>::is_always_lock_free, "async-signal-safe only when lock-free");
std::atomic<bool> g_installed{false};
struct sigaction g_previous[3];

extern "C" void on_stop_signal(int signal) {
  int none = 0;
  if (g_requested.compare_exchange_strong(none, signal)) return;
  // A second signal: the default action, now.
  std::signal(signal, SIG_DFL);
  std::raise(signal);
}

}  // namespace

StopSignals::StopSignals() {
  TANDEM_CHECK(!g_installed.exchange(true), "StopSignals: one instance at a time");
  g_requested = 0;
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // reads and writes in flight carry on
  for (int i = 0; i < 3; i++) sigaction(kSignals[i], &action, &g_previous[i]);
}

StopSignals::~StopSignals() {
  for (int i = 0; i < 3; i++) sigaction(kSignals[i], &g_previous[i], nullptr);
  g_installed = false;
}

int StopSignals::requested() { return g_requested.load(); }

const char* StopSignals::name(int signal) {
  switch (signal) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGHUP:
      return "SIGHUP";
    default:
      return "a signal";
  }
}

}  // namespace tandem

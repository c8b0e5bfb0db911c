// StopSignals: the first SIGINT, SIGTERM or SIGHUP is a request (the process carries on),
// a second ends the process as the signal's default action would, and the previous
// handlers come back when the instance goes. (Training stopping with a checkpoint on each
// signal is tests/runs/checkpoint_crash_test.py --signals, on the tandem binary.)
#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>

#include "tandem/core/stop_signals.h"

namespace tandem {
namespace {

TEST(StopSignals, TheFirstSignalIsARequestAndTheSecondEndsTheProcess) {
  for (int signal : {SIGINT, SIGTERM, SIGHUP}) {
    EXPECT_EXIT(
        {
          const StopSignals signals;
          if (StopSignals::requested() != 0) std::_Exit(3);
          std::raise(signal);
          if (StopSignals::requested() != signal) std::_Exit(4);
          std::raise(SIGINT);  // any second one
          std::_Exit(5);       // not reached
        },
        ::testing::KilledBySignal(SIGINT), "")
        << StopSignals::name(signal);
  }
}

TEST(StopSignals, ThePreviousHandlersComeBack) {
  EXPECT_EXIT(
      {
        std::signal(SIGTERM, SIG_IGN);
        { const StopSignals signals; }
        // Ignored again: under StopSignals' handler the second would end the process.
        std::raise(SIGTERM);
        std::raise(SIGTERM);
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(0), "");
  EXPECT_STREQ(StopSignals::name(SIGHUP), "SIGHUP");
}

}  // namespace
}  // namespace tandem

#include "runtime/common/signals.h"

#include <csignal>
#include <string>

namespace eldr {

namespace {

volatile std::sig_atomic_t g_signal = 0;

extern "C" void RecordSignal(int sig) {
  // Only the first signal counts: a second Ctrl-C must not change the exit code mid-cleanup.
  if (g_signal == 0) g_signal = sig;
}

const char* SignalName(int sig) {
  switch (sig) {
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

}  // namespace

void InstallInterruptHandlers() {
  struct sigaction sa = {};
  sa.sa_handler = RecordSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &sa, nullptr);
}

bool Interrupted() { return g_signal != 0; }

int InterruptSignal() { return g_signal; }

Status InterruptStatus() { return Status::IoError(std::string("interrupted by ") + SignalName(g_signal)); }

int InterruptExitCode() { return 128 + g_signal; }

void ClearInterruptForTesting() { g_signal = 0; }

}  // namespace eldr

#include "runtime/common/signals.h"

#include <signal.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
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

constexpr int kSignals[3] = {SIGINT, SIGTERM, SIGHUP};
bool g_ignored_at_start[3] = {false, false, false};  // set by RecordSignalsFromStart, before main: read-only after

void Record(int sig) {
  struct sigaction sa = {};
  sa.sa_handler = RecordSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(sig, &sa, nullptr);
}

}  // namespace

void InstallInterruptHandlers() {
  for (int sig : kSignals) Record(sig);
}

void RecordSignalsFromStart(int, char**, char** envp) {
  for (int i = 0; i < 3; ++i) {
    struct sigaction inherited = {};
    sigaction(kSignals[i], nullptr, &inherited);
    g_ignored_at_start[i] = inherited.sa_handler == SIG_IGN;  // nohup's SIGHUP, a script's `cmd &` SIGINT: kept
    if (!g_ignored_at_start[i]) Record(kSignals[i]);
  }
  // envp, not getenv: this runs before libc's own initialisers.
  constexpr char kPending[] = "ELDR_PENDING_SIGNAL=";
  for (char** e = envp; e != nullptr && *e != nullptr; ++e) {
    if (std::strncmp(*e, kPending, sizeof(kPending) - 1) == 0) {
      int sig = 0;
      for (const char* c = *e + sizeof(kPending) - 1; *c >= '0' && *c <= '9' && sig < 100; ++c)
        sig = sig * 10 + (*c - '0');
      if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) kill(getpid(), sig);
    }
  }
}

void RestoreInheritedSignalActions() {
  for (int i = 0; i < 3; ++i) std::signal(kSignals[i], g_ignored_at_start[i] ? SIG_IGN : SIG_DFL);
}

bool Interrupted() { return g_signal != 0; }

int InterruptSignal() { return g_signal; }

Status InterruptStatus() { return Status::IoError(std::string("interrupted by ") + SignalName(g_signal)); }

int InterruptExitCode() { return 128 + g_signal; }

int TakeInterrupt() {
  const int sig = g_signal;
  g_signal = 0;
  return sig;
}

void ClearInterruptForTesting() { g_signal = 0; }

}  // namespace eldr

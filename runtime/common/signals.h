// Deferred SIGINT / SIGTERM / SIGHUP for commands that write files (DESIGN.md §5, issue 14).
//
// The handler only records which signal arrived (a volatile sig_atomic_t); it never unlinks, prints or
// exits. Long loops (JSONL import, trace synthesis, HDF5 chunked writes, calibration, simulation, expert placement
// through PlaceHooks, the placement replay) poll Interrupted() and return InterruptStatus(); the Status unwinds
// through the writers, whose AtomicOutput destructors remove the temporaries, AtomicOutput::Commit() refuses to
// rename once a signal arrived, and main() prints one line and exits with InterruptExitCode() (128 + signal, the
// shell's convention).
//
// Thread safety: Interrupted() and InterruptSignal() may be called from any thread and from signal
// handlers. InstallInterruptHandlers() is called from the main thread before any worker thread starts.
#pragma once

#include "runtime/common/status.h"

namespace eldr {

// Installs the recording handler for SIGINT, SIGTERM and SIGHUP (SA_RESTART, so interrupted system calls
// resume). Idempotent. Until it is called those signals keep their default action (the process dies), which
// is what a command that writes nothing wants.
void InstallInterruptHandlers();

// True once one of the three signals arrived after InstallInterruptHandlers(). Cheap: poll it in loops.
bool Interrupted();

// The first signal that arrived (SIGINT, SIGTERM or SIGHUP), or 0.
int InterruptSignal();

// "interrupted by SIGINT" (the name of InterruptSignal()). REQUIRES: Interrupted().
Status InterruptStatus();

// 128 + InterruptSignal(). REQUIRES: Interrupted().
int InterruptExitCode();

// Tests only: forgets a recorded signal (the handlers stay installed).
void ClearInterruptForTesting();

}  // namespace eldr

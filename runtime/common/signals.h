// Deferred SIGINT / SIGTERM / SIGHUP for commands that write files (DESIGN.md §5, issue 14).
//
// The handler only records which signal arrived (a volatile sig_atomic_t); it never unlinks, prints or
// exits. Long loops (JSONL import, trace synthesis, HDF5 chunked writes, calibration, simulation, expert placement
// through PlaceHooks, the placement replay) poll Interrupted() and return InterruptStatus(); the Status unwinds
// through the writers, whose AtomicOutput destructors remove the temporaries, AtomicOutput::Commit() refuses to
// rename once a signal arrived, and main() prints one line and exits with InterruptExitCode() (128 + signal, the
// shell's convention).
//
// The eldr binary installs the same recording handler from its first instant (RecordSignalsFromStart, in its
// .preinit_array: before any shared library's initialisers, of which libcublasLt's take ~0.1 s), so a signal that
// comes before main is not lost: main reports it after parsing the command line as it reports an interrupt (one
// line, 128 + signal), or eldr serve takes it over (TakeInterrupt, InstallServeSignalHandlers); a command that polls
// no interrupt gets the inherited actions back first (RestoreInheritedSignalActions).
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

// InstallInterruptHandlers() with the .preinit_array signature (argc, argv, envp), for the eldr binary alone, except
// that a signal the process inherited as ignored (nohup's SIGHUP) is left ignored.
// ELDR_PENDING_SIGNAL=N (in envp): a signal that came for this process before it started, which a wrapper passes
// on (launch/gpu-bind, when it received N before it exec'd eldr; the tests, to send one before main): the process
// sends itself N at once, after the handlers are in place.
void RecordSignalsFromStart(int argc, char** argv, char** envp);

// SIGINT, SIGTERM and SIGHUP back to the actions the process started with: the default (the process dies), or
// ignored where the caller had them ignored (nohup's SIGHUP), which RecordSignalsFromStart leaves alone too. A signal
// recorded before stays recorded.
void RestoreInheritedSignalActions();

// True once one of the three signals arrived after InstallInterruptHandlers(). Cheap: poll it in loops.
bool Interrupted();

// The first signal that arrived (SIGINT, SIGTERM or SIGHUP), or 0.
int InterruptSignal();

// "interrupted by SIGINT" (the name of InterruptSignal()). REQUIRES: Interrupted().
Status InterruptStatus();

// 128 + InterruptSignal(). REQUIRES: Interrupted().
int InterruptExitCode();

// The signal recorded so far (0 for none), forgotten here: for a command with handlers of its own (eldr serve), which
// installs them first and then takes over what came before.
int TakeInterrupt();

// Tests only: forgets a recorded signal (the handlers stay installed).
void ClearInterruptForTesting();

}  // namespace eldr

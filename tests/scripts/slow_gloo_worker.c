// Test-only amplifier for tests/scripts/exit_stress.py (`--amplify`), loaded with LD_PRELOAD into every rank.
// When a gloo worker thread is about to take the GIL (to run the Python callback of a finished collective, as the
// last collective of tests/scripts/exit_fit.py has, or to release a tensor's Python object), it first sleeps for up to SLOW_WORKER_MS (default 200), as a worker descheduled on a busy
// machine would. A process whose main thread reaches interpreter finalization meanwhile has the worker ask for the
// GIL inside finalization, where Python ends the thread and the unwind aborts the process with "terminate called
// without an active exception", unless it ended its distributed state in order (see strategies/launch/shutdown.py). It
// turns a one-in-hundreds race into a one-in-one failure of unprotected code.
//
// The sleep ends as soon as finalization has begun, so the worker asks for the GIL inside finalization however
// quickly the rest of it would have ended the process. Earlier versions slept after every wake-up a worker sent
// instead (docs/reliability.md says why that was not one-in-one): CPython sends one as it hands the GIL over,
// while it still holds the GIL's mutex, so those sleeps stalled the main thread too, and the outcome depended on
// how fast the machine ran the rest of the exit.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int (*finalizing_fn)(void);

static int is_gloo_worker(void) {
  char name[32] = {0};
  pthread_getname_np(pthread_self(), name, sizeof name);
  return strcmp(name, "pt_gloo_runloop") == 0;
}

static int finalizing(void) {
  static finalizing_fn fn;  // Py_IsFinalizing (3.13+) or _Py_IsFinalizing (before)
  if (!fn) fn = (finalizing_fn)dlsym(RTLD_DEFAULT, "Py_IsFinalizing");
  if (!fn) fn = (finalizing_fn)dlsym(RTLD_DEFAULT, "_Py_IsFinalizing");
  return fn && fn();
}

static void late(void) {
  if (!is_gloo_worker()) return;
  const char* ms = getenv("SLOW_WORKER_MS");
  double wait_ms = ms ? atof(ms) : 200.0;
  struct timespec slice = {0, 1000000L};
  for (double slept = 0.0; slept < wait_ms && !finalizing(); slept += 1.0) nanosleep(&slice, NULL);
}

// The ways torch's C++ code takes the GIL from a thread that does not hold it (pybind11's gil_scoped_acquire).
void PyEval_AcquireThread(void* tstate) {
  static void (*real)(void*);
  if (!real) real = (void (*)(void*))dlsym(RTLD_NEXT, "PyEval_AcquireThread");
  late();
  real(tstate);
}

void PyEval_RestoreThread(void* tstate) {
  static void (*real)(void*);
  if (!real) real = (void (*)(void*))dlsym(RTLD_NEXT, "PyEval_RestoreThread");
  late();
  real(tstate);
}

int PyGILState_Ensure(void) {
  static int (*real)(void);
  if (!real) real = (int (*)(void))dlsym(RTLD_NEXT, "PyGILState_Ensure");
  late();
  return real();
}

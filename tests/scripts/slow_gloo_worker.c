// Test-only amplifier for tests/scripts/exit_stress.py (`--amplify`), loaded with LD_PRELOAD into every rank.
// After a gloo worker thread wakes a waiter (e.g. the future of a finished collective), it sleeps for
// SLOW_WORKER_MS (default 200) before going on, as a worker descheduled on a busy machine would: the references it
// still holds are then dropped late. It sleeps rather than spins, so the woken thread gets the CPU: on a loaded
// machine a spinning worker took CPU from the very thread whose path to finalization the window must cover, and a
// 50 ms window then sometimes closed before that thread got there (the raw control then did not abort). A process that reaches interpreter finalization in that window aborts with
// "terminate called without an active exception" unless it ends its distributed state in order (see
// strategies/shutdown.py). It turns a one-in-hundreds race into a one-in-one failure of unprotected code.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int is_gloo_worker(void) {
  char name[32] = {0};
  pthread_getname_np(pthread_self(), name, sizeof name);
  return strcmp(name, "pt_gloo_runloop") == 0;
}

static void late(void) {
  const char* ms = getenv("SLOW_WORKER_MS");
  double wait = (ms ? atof(ms) : 200.0) / 1000.0;
  struct timespec left = {(time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9)};
  while (nanosleep(&left, &left) != 0) {}  // interrupted by a signal: sleep the rest
}

int pthread_cond_broadcast(pthread_cond_t* cond) {
  static int (*real)(pthread_cond_t*);
  if (!real) real = (int (*)(pthread_cond_t*))dlvsym(RTLD_NEXT, "pthread_cond_broadcast", "GLIBC_2.3.2");
  int rc = real(cond);
  if (is_gloo_worker()) late();
  return rc;
}

int pthread_cond_signal(pthread_cond_t* cond) {
  static int (*real)(pthread_cond_t*);
  if (!real) real = (int (*)(pthread_cond_t*))dlvsym(RTLD_NEXT, "pthread_cond_signal", "GLIBC_2.3.2");
  int rc = real(cond);
  if (is_gloo_worker()) late();
  return rc;
}

/* Valgrind client requests, callable from Python through ctypes (benchmarks/instructions.py).
 *
 * The child process runs under `valgrind --tool=callgrind --instr-atstart=no`: nothing is instrumented while
 * Python starts and imports torch, which keeps a run to about a minute. The benchmark calls marks_start() at the
 * first step it counts and marks_stop() after the last, so the "Collected" total valgrind prints at exit is the
 * instructions those steps executed, and nothing else. Outside valgrind the requests do nothing. */
#include <valgrind/callgrind.h>

void marks_start(void) { CALLGRIND_START_INSTRUMENTATION; }

void marks_stop(void) { CALLGRIND_STOP_INSTRUMENTATION; }

int marks_on_valgrind(void) { return RUNNING_ON_VALGRIND; }

/* Valgrind client requests, callable from Python through ctypes (benchmarks/instructions.py).
 *
 * The child process runs under `valgrind --tool=callgrind --instr-atstart=no`: nothing is instrumented while
 * Python starts and imports torch, which keeps a run to a minute or two. For each variant the benchmark calls
 * marks_start() at the first step it counts and marks_stop("<variant>") after the last, which writes the counts
 * of those steps, and nothing else, to a dump file of their own. Outside valgrind the requests do nothing. */
#include <valgrind/callgrind.h>

void marks_start(void) {
    CALLGRIND_ZERO_STATS;
    CALLGRIND_START_INSTRUMENTATION;
}

void marks_stop(const char *name) {
    CALLGRIND_STOP_INSTRUMENTATION;
    CALLGRIND_DUMP_STATS_AT(name);
}

int marks_on_valgrind(void) { return RUNNING_ON_VALGRIND; }

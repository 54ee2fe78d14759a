#pragma once
// For kiln's command-line tools: on a fatal signal (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT) the
// process writes the signal, its thread and a backtrace (module + offset a frame, which
// `addr2line -e MODULE OFFSET` resolves) to stderr, then dies of the signal as it would have.
// A crash seen once in a test log then says where it happened.
namespace kiln::cli {

void trace_fatal_signals(const char* program);

}  // namespace kiln::cli

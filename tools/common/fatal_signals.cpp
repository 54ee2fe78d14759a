#include "fatal_signals.h"

#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <initializer_list>

namespace kiln::cli {

namespace {

const char* g_program = "kiln";
char g_stack[64 * 1024];  // the main thread's handler stack: its stack overflow still gets a trace

// Writes with write(2) only: the handler may run while malloc's or stdio's locks are held.
void put(const char* s) {
  if (::write(STDERR_FILENO, s, std::strlen(s)) < 0) return;
}
// v in `base` (10 or 16), from a buffer on the stack.
void put_number(unsigned long v, unsigned base) {
  char out[24];
  int n = sizeof out - 1;
  out[n] = '\0';
  do {
    out[--n] = "0123456789abcdef"[v % base];
    v /= base;
  } while (v != 0 && n > 0);
  put(out + n);
}

void on_fatal(int sig, siginfo_t* info, void*) {
  put(g_program);
  put(": fatal signal ");
  put_number(static_cast<unsigned long>(sig), 10);
  put(" (");
  put(sigdescr_np(sig) ? sigdescr_np(sig) : "?");
  put(") in thread ");
  put_number(static_cast<unsigned long>(::gettid()), 10);
  if (info->si_code <= 0) {  // sent (kill, raise, abort), not raised by a fault
    put(" sent by process ");
    put_number(static_cast<unsigned long>(info->si_pid), 10);
  } else if (sig == SIGSEGV || sig == SIGBUS) {
    put(" at address 0x");
    put_number(reinterpret_cast<unsigned long>(info->si_addr), 16);
  }
  put("; backtrace:\n");
  void* frames[64];
  const int n = ::backtrace(frames, 64);
  ::backtrace_symbols_fd(frames, n, STDERR_FILENO);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

}  // namespace

void trace_fatal_signals(const char* program) {
  g_program = program;
  void* warm[1];
  (void)::backtrace(warm, 1);  // loads the unwinder now, not inside the handler
  stack_t alt{};
  alt.ss_sp = g_stack;
  alt.ss_size = sizeof g_stack;
  ::sigaltstack(&alt, nullptr);
  struct sigaction sa {};
  sa.sa_sigaction = on_fatal;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  ::sigemptyset(&sa.sa_mask);
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) ::sigaction(sig, &sa, nullptr);
}

}  // namespace kiln::cli

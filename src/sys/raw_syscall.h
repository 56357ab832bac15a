// Raw system calls that never touch errno or any other libc state.
//
// Why: the container runtime starts sandboxes with clone(CLONE_VM) from a
// multi-threaded daemon. The child shares the parent's memory *and* its TLS
// (errno is thread-local), so a libc wrapper that sets errno in the child would
// clobber the errno of the parent thread. Every call made by such a child goes
// through these helpers, which return -errno on failure and never allocate.
// They are always inlined, at -O0 too: an out-of-line copy would be instrumented in a
// ThreadSanitizer build, and such a child must run no sanitizer code (it would update
// the parent thread's sanitizer state, which it shares through the TLS).
// Thread rules: async-signal-safe, usable anywhere.
#pragma once

#include <sys/syscall.h>

#define TP_RAW_INLINE inline __attribute__((always_inline))

namespace tp::sys::raw {

#if defined(__x86_64__)
TP_RAW_INLINE long syscall6(long nr, long a1 = 0, long a2 = 0, long a3 = 0, long a4 = 0,
                            long a5 = 0, long a6 = 0) {
  long ret;
  register long r10 asm("r10") = a4;
  register long r8 asm("r8") = a5;
  register long r9 asm("r9") = a6;
  asm volatile("syscall"
               : "=a"(ret)
               : "a"(nr), "D"(a1), "S"(a2), "d"(a3), "r"(r10), "r"(r8), "r"(r9)
               : "rcx", "r11", "memory");
  return ret;
}
#elif defined(__aarch64__)
TP_RAW_INLINE long syscall6(long nr, long a1 = 0, long a2 = 0, long a3 = 0, long a4 = 0,
                            long a5 = 0, long a6 = 0) {
  register long x8 asm("x8") = nr;
  register long x0 asm("x0") = a1;
  register long x1 asm("x1") = a2;
  register long x2 asm("x2") = a3;
  register long x3 asm("x3") = a4;
  register long x4 asm("x4") = a5;
  register long x5 asm("x5") = a6;
  asm volatile("svc 0"
               : "+r"(x0)
               : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5)
               : "memory");
  return x0;
}
#else
#error "tp::sys::raw: unsupported architecture"
#endif

template <typename... A>
TP_RAW_INLINE long call(long nr, A... args) {
  return syscall6(nr, ((long)args)...);
}

[[noreturn]] TP_RAW_INLINE void exit_now(int code) {
  for (;;) syscall6(SYS_exit_group, code);
}

}  // namespace tp::sys::raw

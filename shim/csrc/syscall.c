/*
 * syscall(2), the C library's generic entry point, as librdmashim.so defines it.
 *
 * Some programs close, duplicate and sandbox through syscall() rather than the named
 * wrappers: libuv (Node.js and every other libuv program) closes each descriptor with
 * syscall(SYS_close, fd); libseccomp installs its filters with syscall(SYS_seccomp, ...);
 * io_uring has no glibc wrapper at all. A close the shim never sees leaves a connection
 * open on its ring and the descriptor's entry behind, so these numbers go to the Rust half
 * (shim/src/hooks/syscall.rs), which runs the same logic as the named hooks. Every other
 * number (Rust's futex waits, gettid, getrandom, ...) is made here directly, without a
 * lookup, lock or thread-local access other than errno, and with glibc's result convention:
 * the kernel's value, or -1 with errno set.
 *
 * The arguments are read as six longs whatever the number, as glibc's own syscall() does
 * (sysdeps/unix/sysv/linux/x86_64/syscall.S moves six registers).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <sys/syscall.h>

/* Defined in Rust (shim/src/hooks/syscall.rs). */
extern long rdmashim_syscall(long nr, long a1, long a2, long a3, long a4, long a5, long a6);

static long raw_syscall6(long nr, long a1, long a2, long a3, long a4, long a5, long a6)
{
#if defined(__x86_64__)
    register long r10 __asm__("r10") = a4;
    register long r8 __asm__("r8") = a5;
    register long r9 __asm__("r9") = a6;
    long ret;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "0"(nr), "D"(a1), "S"(a2), "d"(a3), "r"(r10), "r"(r8), "r"(r9)
                     : "rcx", "r11", "memory");
    return ret;
#elif defined(__aarch64__)
    register long x8 __asm__("x8") = nr;
    register long x0 __asm__("x0") = a1;
    register long x1 __asm__("x1") = a2;
    register long x2 __asm__("x2") = a3;
    register long x3 __asm__("x3") = a4;
    register long x4 __asm__("x4") = a5;
    register long x5 __asm__("x5") = a6;
    __asm__ volatile("svc 0"
                     : "+r"(x0)
                     : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5)
                     : "memory");
    return x0;
#else
#error "syscall.c: no system call sequence for this architecture"
#endif
}

/* Whether the shim has logic for system call `nr` (the named hooks' numbers). */
static int hooked(long nr)
{
    switch (nr) {
    case SYS_close:
    case SYS_dup:
    case SYS_dup3:
    case SYS_fcntl:
    case SYS_prctl:
#ifdef SYS_dup2
    case SYS_dup2:
#endif
#ifdef SYS_close_range
    case SYS_close_range:
#endif
#ifdef SYS_seccomp
    case SYS_seccomp:
#endif
#ifdef SYS_io_uring_setup
    case SYS_io_uring_setup:
#endif
        return 1;
    default:
        return 0;
    }
}

long syscall(long nr, ...)
{
    va_list ap;
    va_start(ap, nr);
    long a1 = va_arg(ap, long);
    long a2 = va_arg(ap, long);
    long a3 = va_arg(ap, long);
    long a4 = va_arg(ap, long);
    long a5 = va_arg(ap, long);
    long a6 = va_arg(ap, long);
    va_end(ap);
    if (hooked(nr))
        return rdmashim_syscall(nr, a1, a2, a3, a4, a5, a6);
    long r = raw_syscall6(nr, a1, a2, a3, a4, a5, a6);
    if ((unsigned long)r > -4096UL) {
        errno = (int)-r;
        return -1;
    }
    return r;
}

/*
 * C-variadic entry points of librdmashim.so: fcntl(2), fcntl64, ioctl(2), prctl(2).
 *
 * Stable Rust cannot define a C-variadic function, so these read the optional third argument
 * according to the command (as the man pages define it) and call a Rust function with a fixed
 * signature, which does all the work. Nothing else lives here.
 *
 * fcntl(2): commands taking an int read an int; commands taking a pointer read a pointer;
 * commands taking nothing read nothing; unknown commands read a pointer-sized value, as glibc's
 * own fcntl does (sysdeps/unix/sysv/linux/fcntl64.c: va_arg (ap, void *)).
 * ioctl(2): the third argument is, by convention, a pointer or an integer of at most pointer width;
 * glibc reads it as void * (sysdeps/unix/sysv/linux/ioctl.c), and so do we.
 * prctl(2): four optional arguments, read as unsigned long whatever the option, as glibc's
 * own prctl does (sysdeps/unix/sysv/linux/prctl.c).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>

/* Defined in Rust (shim/src/hooks/fd.rs). `which`: 0 = fcntl, 1 = fcntl64. */
extern int rdmashim_fcntl(int fd, int cmd, uintptr_t arg, int which);
extern int rdmashim_ioctl(int fd, unsigned long request, uintptr_t arg);
/* Defined in Rust (shim/src/hooks/process.rs). */
extern int rdmashim_prctl(int option, unsigned long a2, unsigned long a3, unsigned long a4,
                          unsigned long a5);

/* Linux command numbers that may be missing from older headers. */
#ifndef F_OFD_GETLK
#define F_OFD_GETLK 36
#define F_OFD_SETLK 37
#define F_OFD_SETLKW 38
#endif
#ifndef F_GET_RW_HINT
#define F_GET_RW_HINT 1035
#define F_SET_RW_HINT 1036
#define F_GET_FILE_RW_HINT 1037
#define F_SET_FILE_RW_HINT 1038
#endif
#ifndef F_ADD_SEALS
#define F_ADD_SEALS 1033
#define F_GET_SEALS 1034
#endif

static uintptr_t fcntl_arg(int cmd, va_list *ap)
{
    switch (cmd) {
    /* no argument */
    case F_GETFD:
    case F_GETFL:
    case F_GETOWN:
    case F_GETSIG:
    case F_GETLEASE:
    case F_GETPIPE_SZ:
    case F_GET_SEALS:
        return 0;
    /* int argument */
    case F_DUPFD:
    case F_DUPFD_CLOEXEC:
    case F_SETFD:
    case F_SETFL:
    case F_SETOWN:
    case F_SETSIG:
    case F_SETLEASE:
    case F_NOTIFY:
    case F_SETPIPE_SZ:
    case F_ADD_SEALS:
        return (uintptr_t)(intptr_t)va_arg(*ap, int);
    /* pointer argument (struct flock *, struct f_owner_ex *, uint64_t *) and unknown commands */
    default:
        return (uintptr_t)va_arg(*ap, void *);
    }
}

int fcntl(int fd, int cmd, ...)
{
    va_list ap;
    va_start(ap, cmd);
    uintptr_t arg = fcntl_arg(cmd, &ap);
    va_end(ap);
    return rdmashim_fcntl(fd, cmd, arg, 0);
}

int fcntl64(int fd, int cmd, ...)
{
    va_list ap;
    va_start(ap, cmd);
    uintptr_t arg = fcntl_arg(cmd, &ap);
    va_end(ap);
    return rdmashim_fcntl(fd, cmd, arg, 1);
}

int ioctl(int fd, unsigned long request, ...)
{
    va_list ap;
    va_start(ap, request);
    uintptr_t arg = (uintptr_t)va_arg(ap, void *);
    va_end(ap);
    return rdmashim_ioctl(fd, request, arg);
}

int prctl(int option, ...)
{
    va_list ap;
    va_start(ap, option);
    unsigned long a2 = va_arg(ap, unsigned long);
    unsigned long a3 = va_arg(ap, unsigned long);
    unsigned long a4 = va_arg(ap, unsigned long);
    unsigned long a5 = va_arg(ap, unsigned long);
    va_end(ap);
    return rdmashim_prctl(option, a2, a3, a4, a5);
}

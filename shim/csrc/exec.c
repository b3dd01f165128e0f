/*
 * execl(3), execlp(3), execle(3): glibc builds the argument vector and calls its internal
 * execve, which no preload sees. These take the list, build the vector and call the exported
 * execv/execvp/execve — the shim's hooks (shim/src/hooks/process.rs), which return the
 * process's upgraded connections to TCP before the image is replaced.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <unistd.h>

/* The argument count of a NULL-terminated variadic list that starts with arg0. */
static size_t count_args(const char *arg0, va_list ap)
{
    size_t n = 1;
    va_list cp;
    va_copy(cp, ap);
    if (arg0 != NULL)
        while (va_arg(cp, const char *) != NULL)
            n++;
    va_end(cp);
    return arg0 != NULL ? n : 0;
}

/* Fills argv (room for n + 1) from arg0 and the list; leaves the list after the NULL. */
static void fill_args(char **argv, size_t n, const char *arg0, va_list *ap)
{
    if (n == 0) {
        argv[0] = NULL;
        return;
    }
    argv[0] = (char *)arg0;
    for (size_t i = 1; i <= n; i++)
        argv[i] = va_arg(*ap, char *);
}

/* Arguments beyond this many are refused with E2BIG (the kernel's own limit is far lower). */
#define MAX_ARGS 65536

int execl(const char *path, const char *arg0, ...)
{
    va_list ap;
    va_start(ap, arg0);
    size_t n = count_args(arg0, ap);
    if (n > MAX_ARGS) {
        va_end(ap);
        errno = E2BIG;
        return -1;
    }
    char *argv[n + 1];
    fill_args(argv, n, arg0, &ap);
    va_end(ap);
    return execv(path, argv);
}

int execlp(const char *file, const char *arg0, ...)
{
    va_list ap;
    va_start(ap, arg0);
    size_t n = count_args(arg0, ap);
    if (n > MAX_ARGS) {
        va_end(ap);
        errno = E2BIG;
        return -1;
    }
    char *argv[n + 1];
    fill_args(argv, n, arg0, &ap);
    va_end(ap);
    return execvp(file, argv);
}

int execle(const char *path, const char *arg0, ...)
{
    va_list ap;
    va_start(ap, arg0);
    size_t n = count_args(arg0, ap);
    if (n > MAX_ARGS) {
        va_end(ap);
        errno = E2BIG;
        return -1;
    }
    char *argv[n + 1];
    fill_args(argv, n, arg0, &ap);
    /* After the list's NULL: the environment. */
    char *const *envp = va_arg(ap, char *const *);
    va_end(ap);
    return execve(path, argv, envp);
}

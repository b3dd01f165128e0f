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

/* Arguments beyond this many are refused with E2BIG (the kernel's own limit is far lower). */
#define MAX_ARGS 65536

enum kind { BY_PATH, BY_SEARCH, WITH_ENV };

/*
 * The common part: counts the NULL-terminated list that starts with arg0, builds the vector
 * (and, for execle, takes the environment after the list's NULL), and calls the exported
 * function for `kind`.
 */
static int run(enum kind kind, const char *target, const char *arg0, va_list *ap)
{
    size_t n = 0;
    if (arg0 != NULL) {
        va_list cp;
        va_copy(cp, *ap);
        for (n = 1; va_arg(cp, const char *) != NULL; n++)
            if (n > MAX_ARGS)
                break;
        va_end(cp);
    }
    if (n > MAX_ARGS) {
        errno = E2BIG;
        return -1;
    }
    char *argv[n + 1];
    argv[0] = (char *)arg0;
    /* (the list's own NULL ends the vector) */
    for (size_t i = 1; i <= n; i++)
        argv[i] = va_arg(*ap, char *);
    if (n == 0)
        argv[0] = NULL;
    switch (kind) {
    case BY_PATH:
        return execv(target, argv);
    case BY_SEARCH:
        return execvp(target, argv);
    case WITH_ENV:
    default: {
        char *const *envp = va_arg(*ap, char *const *);
        return execve(target, argv, envp);
    }
    }
}

int execl(const char *path, const char *arg0, ...)
{
    va_list ap;
    va_start(ap, arg0);
    int r = run(BY_PATH, path, arg0, &ap);
    va_end(ap);
    return r;
}

int execlp(const char *file, const char *arg0, ...)
{
    va_list ap;
    va_start(ap, arg0);
    int r = run(BY_SEARCH, file, arg0, &ap);
    va_end(ap);
    return r;
}

int execle(const char *path, const char *arg0, ...)
{
    va_list ap;
    va_start(ap, arg0);
    int r = run(WITH_ENV, path, arg0, &ap);
    va_end(ap);
    return r;
}

/*
 * fdopen(3) on a TCP socket the shim tracks: a stdio stream whose reads, writes and close go
 * through the shim's hooks (shim/src/hooks/stdio.rs).
 *
 * glibc's stdio calls its internal __read/__write/__close on a FILE's descriptor, which no
 * preload sees: the bytes of an fdopen'ed socket would bypass the upgrade (and its close would
 * be missed). A stream made with fopencookie calls the functions it is given instead. Its
 * _fileno is -2 ("not a real file"), so fileno() would fail; setting it to the socket makes
 * fileno() answer as for fdopen's stream. glibc's cookie functions never use _fileno for I/O:
 * it only marks the stream open (_IO_file_is_open), and the close resets it to -1. The field
 * is part of glibc's public struct _IO_FILE (<bits/types/struct_FILE.h>), fixed by its ABI.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

/* Defined in Rust (shim/src/hooks/stdio.rs); the cookie is the descriptor. */
extern ssize_t rdmashim_stream_read(void *cookie, char *buf, size_t size);
extern ssize_t rdmashim_stream_write(void *cookie, const char *buf, size_t size);
extern int rdmashim_stream_seek(void *cookie, off64_t *offset, int whence);
extern int rdmashim_stream_close(void *cookie);

FILE *rdmashim_stream_open(int fd, const char *mode)
{
    cookie_io_functions_t io = {
        .read = rdmashim_stream_read,
        .write = rdmashim_stream_write,
        .seek = rdmashim_stream_seek,
        .close = rdmashim_stream_close,
    };
    FILE *f = fopencookie((void *)(intptr_t)fd, mode, io);
    if (f != NULL)
        f->_fileno = fd;
    return f;
}

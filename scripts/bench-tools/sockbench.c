/* sockbench.c -- a tiny TCP ping-pong, stream and connection-rate tool for scripts/bench.
 *
 *   sockbench server IP PORT [epoll]
 *       serves connections until SIGTERM/SIGINT (then exits normally, so a preload's exit
 *       handlers run). The client's first 5 bytes select the mode and size. A held connection
 *       (hold, burst) gets a thread of its own; the others are served one at a time. With
 *       epoll, one epoll loop echoes every held connection, as a server of many clients
 *       would (rsocket's preload has no epoll: scripts/bench keeps the threads), and the
 *       others get a thread each.
 *   sockbench client IP PORT pp SIZE SECONDS [WARMUP]
 *       ping-pong of SIZE-byte messages for SECONDS, after at least 100 and WARMUP seconds
 *       (default 0) of uncounted ones; prints one JSON line with the median and
 *       99th percentile of the one-way latency (round trip / 2, as sockperf and ib_write_lat
 *       report it), in microseconds: {"p50_us":..,"p99_us":..,"samples":..,"tsc":0|1}
 *       (tsc 1: timed with the CPU's time-stamp counter, see ticks() below)
 *   sockbench client IP PORT stream SIZE SECONDS [WARMUP]
 *       sends SIZE-byte writes for WARMUP (default 0) + SECONDS seconds, then shuts down its
 *       sending side and waits for the server's byte count; the rate counts the bytes sent
 *       after the warm-up over the time from its end to the count's arrival:
 *       {"gbit_s":..,"bytes":..,"seconds":..,"warmup":..}
 *   sockbench client IP PORT conn SIZE SECONDS [WARMUP]
 *       short connections for SECONDS: connect, send SIZE bytes, receive the SIZE-byte echo,
 *       close: {"conn_s":..,"connections":..,"seconds":..}. The same loop runs WARMUP seconds
 *       first (default 0) without being counted: a steady rate, apart from the once-per-process
 *       work that `first` measures.
 *   sockbench client IP PORT hold N SECONDS
 *       memory per connection: opens N connections (echoing 64 B messages), one echo on each, SECONDS idle (so that a preload can move
 *       them), then one more echo on each, and reports the proportional set size (Pss:
 *       shared pages split among the processes that map them) that the N connections added,
 *       in this process and in the server's (asked over a connection of its own before and
 *       after): {"conns":..,"client_kib":..,"server_kib":..,"kib_per_conn":..}
 *   sockbench client IP PORT burst N SECONDS
 *       a burst of connections (scripts/bench-scale): opens N connections one right after
 *       another, then one 64 B echo on each, and prints {"burst_ms":..,"conns":N} (the time
 *       that took) at once; then SECONDS idle, then one more echo on each, timed (all, and
 *       each one's round trip: median and 99th percentile):
 *       {"echo_ms":..,"rtt_p50_us":..,"rtt_p99_us":..,"pinned_kib":..,"rss_kib":..} (this
 *       process's VmPin and VmRSS then), and it closes them. The server is not asked anything: it serves exactly N.
 *   sockbench client IP PORT multi K SIZE SECONDS up|down|both [WARMUP]
 *       busy connections side by side (scripts/bench-scale's traffic patterns): opens K
 *       connections and one more for a 64 B ping-pong, then, for WARMUP (default 2) seconds
 *       uncounted and SECONDS counted, streams SIZE-byte writes on every one of the K: `up`
 *       from this process to the server (N-to-1 at the server), `down` from the server to this
 *       process (1-to-N), `both` ways at once (N-to-N). Each receiver counts the bytes it
 *       received within the counted window (the window is sent to the server as wall-clock
 *       times: one host's clock, or hosts kept in step); the server sends its count when this process
 *       shuts its sending side. The ping-pong runs through the same window:
 *       {"mode":..,"conns":K,"gbit_s":..,"up_gbit_s":..,"down_gbit_s":..,"min_conn_gbit_s":..,
 *        "max_conn_gbit_s":..,"p50_us":..,"p99_us":..,"samples":..,"tsc":0|1}
 *       (aggregate rates; one connection's slowest and fastest, both ways added; the
 *       ping-pong's one-way latency as in pp, null if no round trip started in the window
 *       finished: a ping-pong starved by the busy ones)
 *   sockbench client IP PORT first SIZE SECONDS
 *       a fresh process's one short connection (as conn), then SECONDS idle, so that work a
 *       preload does in the background for it is done: the connection's time and the CPU time
 *       (user + system, all threads, from exec on) the whole process used:
 *       {"first_ms":..,"cpu_ms":..}
 *
 * The ping-pong's client also reports the CPU time (user + system, every thread of the
 * process) it used per counted round trip ("cpu_us"), and the server prints one JSON line
 * per ping-pong connection it served: {"served":"pp","round_trips":..,"cpu_us":..} (its CPU
 * time over that whole connection, warm-up included, per round trip). With
 * SOCKBENCH_ANSWER_US=N the server holds each ping-pong answer back N microseconds (a busy
 * wait on the monotonic clock), so that a client always waits for it — as it does at full
 * speed, where a slowed client (under callgrind) would otherwise find it already there.
 * With SOCKBENCH_SLICE_MS=N the ping-pong's line also has "slices_us": the one-way median of
 * each N ms of the counted run, in order (a host that moves its CPUs between faster and
 * slower placements shows it there, and a comparison can take them apart).
 * With SOCKBENCH_TURNS=R,W the ping-pong runs in turns another process hands out (ab-turns):
 * before each turn the client reads a byte from descriptor R (its end: the run's), plays
 * SOCKBENCH_SLICE_MS (default 50) of ping-pong, then writes a byte to W; it prints
 * {"turns_us":[..]}, the one-way median of each turn (SECONDS and WARMUP are not used).
 *
 * Only blocking socket(), connect(), accept(), send(), recv(), shutdown() and close(): the
 * calls every socket preload (rdmashim, rsocket's librspreload) intercepts. sockperf (sendto
 * with an address on a connected socket) and qperf (fcntl F_SETOWN) fail under rsocket's
 * preload, so scripts/bench uses this to get rsocket figures at all. Any error: a message on
 * stderr and exit status 1.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t stop;
static void on_signal(int s) { (void)s; stop = 1; }

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* How far the wall clock is ahead of now()'s: a time both ends of a connection understand (one
 * host's clock, or hosts kept in step) is now() + wall_offset(). */
static double wall_offset(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return t.tv_sec + t.tv_nsec / 1e9 - now();
}

/* The ping-pong's clock: the CPU's time-stamp counter on x86-64 (as perftest times
 * ib_write_lat), unless SOCKBENCH_CLOCK=mono; else the monotonic clock. A monotonic-clock read
 * is a system call under clocksources without a vDSO reader (HPET, as in the soft-RoCE VM:
 * 2.3 us under TCG), and two per round trip would count about one per one-way latency. The
 * counter's rate is taken from the monotonic clock over the run, and checked: the rates over
 * the run's two halves must agree within 2% (the VM's CPU does not advertise an invariant
 * counter, but it is one), or the run fails. */
#if defined(__x86_64__)
#include <x86intrin.h>
static int tsc_wanted(void) {
    const char *c = getenv("SOCKBENCH_CLOCK");
    return !(c && !strcmp(c, "mono"));
}
static uint64_t ticks(void) { return __rdtsc(); }
#else
static int tsc_wanted(void) { return 0; }
static uint64_t ticks(void) { return 0; }
#endif

static int full(int fd, void *buf, size_t n, int rx) {
    char *p = buf;
    while (n) {
        ssize_t r = rx ? recv(fd, p, n, 0) : send(fd, p, n, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static void die(const char *what) {
    fprintf(stderr, "sockbench: %s: %s\n", what, errno ? strerror(errno) : "connection closed");
    exit(1);
}

static struct sockaddr_in addr(const char *ip, const char *port) {
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)atoi(port));
    if (inet_pton(AF_INET, ip, &a.sin_addr) != 1) { errno = EINVAL; die("address"); }
    return a;
}

/* The CPU time (user + system, all threads) this process has used, in seconds. */
static double cpu_now(void) {
    struct rusage u;
    if (getrusage(RUSAGE_SELF, &u)) die("getrusage");
    return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

/* This process's proportional set size, in KiB (Linux's /proc/self/smaps_rollup). */
static long pss_kib(void) {
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    char line[256];
    long v = -1;
    if (!f) die("/proc/self/smaps_rollup");
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "Pss: %ld kB", &v) == 1) break;
    fclose(f);
    if (v < 0) { errno = 0; die("no Pss in /proc/self/smaps_rollup"); }
    return v;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Appends x to the growing array *v of *n samples (*cap allocated). */
static void push(double **v, size_t *n, size_t *cap, double x) {
    if (*n == *cap && !(*v = realloc(*v, (*cap *= 2) * sizeof **v))) die("realloc");
    (*v)[(*n)++] = x;
}

/* The median of the n values at v (sorted in place; n > 0). */
static double median(double *v, size_t n) {
    qsort(v, n, sizeof *v, cmp);
    return v[n / 2];
}

/* Exits with a message unless hz is a believable rate of the time-stamp counter. */
static void check_rate(double hz) {
    if (hz > 5e7 && hz < 2e10) return;
    errno = 0;
    fprintf(stderr, "sockbench: the time-stamp counter's rate (%.0f Hz) is not believable: run with SOCKBENCH_CLOCK=mono\n", hz);
    exit(1);
}

/* A connected client socket, Nagle off. */
static int dial(const struct sockaddr_in *a) {
    int one = 1;
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (c < 0 || connect(c, (const void *)a, sizeof *a)) die("connect");
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return c;
}

/* Sleeps SECS seconds, through signals. */
static void idle(double secs) {
    struct timespec t = {(time_t)secs, (long)((secs - (time_t)secs) * 1e9)};
    while (nanosleep(&t, &t) && errno == EINTR) {}
}

/* One short connection of the conn and first modes: connect, SIZE bytes echoed, close. */
static void one_conn(const struct sockaddr_in *a, char *msg, uint32_t size) {
    int c = dial(a);
    if (full(c, msg, size + 5, 0)) die("send");
    if (full(c, msg + 5, size, 1)) die("recv");
    if (close(c)) die("close");
}

/* The busy modes' sending side: SIZE-byte writes until the window's end (or the peer is gone). */
struct sender {
    int c;
    uint32_t size;
    double until;
    char *buf;
};

static void *send_until(void *arg) {
    struct sender *s = arg;
    while (now() < s->until)
        if (full(s->c, s->buf, s->size, 0)) break;
    return NULL;
}

/* A busy connection's receiving side (both ends): every byte until the end of the stream,
 * those received within [from, until) counted; the last 8 bytes kept (the server's count,
 * which follows the window). */
struct received {
    uint64_t counted, total, last8;
    int error; /* the stream ended with an error, not its end */
};

static struct received receive_counting(int c, char *buf, uint32_t size, double from, double until) {
    struct received v = {0};
    ssize_t r;
    while ((r = recv(c, buf, size, 0)) > 0 || (r < 0 && errno == EINTR)) {
        if (r <= 0) continue;
        double t = now();
        if (t >= from && t < until) v.counted += (uint64_t)r;
        v.total += (uint64_t)r;
        /* (the last 8 bytes of the stream, across recv boundaries) */
        for (ssize_t i = r > 8 ? r - 8 : 0; i < r; i++) v.last8 = v.last8 << 8 | (unsigned char)buf[i];
    }
    v.error = r < 0;
    return v;
}

/* The server's end of a busy connection ('U' up, 'D' down, 'B' both): the window follows the
 * header, as wall-clock times (a server's thread that starts late still counts what arrives
 * within the client's window); its count of received bytes goes back once the client has shut
 * its sending side (big-endian, 8 bytes: the client reads the stream's last 8). */
static void serve_busy(int c, unsigned char mode, uint32_t size, char *buf) {
    double w[2];
    if (full(c, w, sizeof w, 1)) return;
    double off = wall_offset(), from = w[0] - off, until = w[1] - off;
    if (!(until > from && until < now() + 3600)) return;
    struct sender s = {c, size, until, NULL};
    pthread_t th;
    int sending = 0;
    if (mode != 'U') {
        s.buf = calloc(1, size);
        sending = s.buf && !pthread_create(&th, NULL, send_until, &s);
    }
    uint64_t got = receive_counting(c, buf, size, from, until).counted;
    if (sending) pthread_join(th, NULL);
    free(s.buf);
    unsigned char be[8];
    for (int i = 0; i < 8; i++) be[i] = (unsigned char)(got >> (56 - 8 * i));
    full(c, be, 8, 0);
}

static void serve(int c) {
    unsigned char hdr[5];
    if (full(c, hdr, 5, 1)) return;
    uint32_t size;
    memcpy(&size, hdr + 1, 4);
    if (size == 0 || size > (1u << 24)) return;
    char *buf = malloc(size);
    if (!buf) return;
    if (hdr[0] == 'U' || hdr[0] == 'D' || hdr[0] == 'B') {
        serve_busy(c, hdr[0], size, buf);
    } else if (hdr[0] == 'C') {
        if (!full(c, buf, size, 1)) full(c, buf, size, 0);
    } else if (hdr[0] == 'P' || hdr[0] == 'H') {
        double cpu0 = cpu_now();
        long n = 0;
        const char *d = getenv("SOCKBENCH_ANSWER_US");
        double hold = hdr[0] == 'P' && d ? atof(d) / 1e6 : 0;
        while (!full(c, buf, size, 1)) {
            if (hold > 0)
                for (double until = now() + hold; now() < until;)
                    ;
            if (full(c, buf, size, 0)) break;
            n++;
        }
        if (hdr[0] == 'P' && n > 0) {
            printf("{\"served\": \"pp\", \"round_trips\": %ld, \"cpu_us\": %.3f}\n", n, (cpu_now() - cpu0) / n * 1e6);
            fflush(stdout);
        }
    } else if (hdr[0] == 'M') {
        int64_t v = pss_kib();
        full(c, &v, 8, 0);
    } else {
        uint64_t total = 0;
        ssize_t r;
        while ((r = recv(c, buf, size, 0)) > 0 || (r < 0 && errno == EINTR))
            if (r > 0) total += (uint64_t)r;
        full(c, &total, 8, 0);
    }
    free(buf);
}

/* The server's event loop. Every accepted connection joins it; its first byte tells its mode:
 * a held connection ('H') is echoed by the loop itself, byte for byte, for as long as it
 * lasts; any other leaves the loop and is served (blocking, one at a time, as before) by a
 * thread of its own, so a held burst never waits behind it nor it behind the burst. */
struct loop {
    int ep;
    size_t cap;
    unsigned char *skip; /* per fd: header bytes of a held connection still to consume */
};

static struct loop *loop_new(void) {
    struct rlimit r;
    struct loop *lp = calloc(1, sizeof *lp);
    if (!lp || getrlimit(RLIMIT_NOFILE, &r)) die("loop");
    lp->cap = r.rlim_cur == RLIM_INFINITY || r.rlim_cur > (1u << 20) ? (1u << 20) : (size_t)r.rlim_cur;
    lp->skip = calloc(lp->cap, 1);
    lp->ep = epoll_create1(EPOLL_CLOEXEC);
    if (!lp->skip || lp->ep < 0) die("epoll_create1");
    return lp;
}

static void loop_add(struct loop *lp, int c) {
    struct epoll_event e = {.events = EPOLLIN, .data.fd = c};
    if ((size_t)c >= lp->cap) { errno = EMFILE; die("accept: fd past RLIMIT_NOFILE"); }
    lp->skip[c] = 0xff; /* (mode not known yet) */
    if (epoll_ctl(lp->ep, EPOLL_CTL_ADD, c, &e)) die("epoll_ctl");
}

static void *serve_thread(void *arg) {
    int c = (int)(intptr_t)arg;
    serve(c);
    close(c);
    return NULL;
}

static void *held_loop(void *arg) {
    struct loop *lp = arg;
    struct epoll_event ev[256];
    char buf[4096];
    for (;;) {
        int n = epoll_wait(lp->ep, ev, 256, -1);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) die("epoll_wait");
        for (int i = 0; i < n; i++) {
            int c = ev[i].data.fd;
            if (lp->skip[c] == 0xff) {
                unsigned char h;
                ssize_t r = recv(c, &h, 1, MSG_PEEK | MSG_DONTWAIT);
                if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
                if (r == 1 && h != 'H') {
                    pthread_t t;
                    epoll_ctl(lp->ep, EPOLL_CTL_DEL, c, NULL);
                    if (pthread_create(&t, NULL, serve_thread, (void *)(intptr_t)c)) die("pthread_create");
                    pthread_detach(t);
                    continue;
                }
                lp->skip[c] = 5;
            }
            ssize_t r = recv(c, buf, sizeof buf, MSG_DONTWAIT);
            if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
            if (r <= 0) {
                epoll_ctl(lp->ep, EPOLL_CTL_DEL, c, NULL);
                close(c);
                continue;
            }
            size_t k = (size_t)r < lp->skip[c] ? (size_t)r : lp->skip[c];
            lp->skip[c] -= (unsigned char)k;
            /* (the echo, blocking: 64 B messages always fit the send buffer) */
            if (full(c, buf + k, (size_t)r - k, 0)) {
                epoll_ctl(lp->ep, EPOLL_CTL_DEL, c, NULL);
                close(c);
            }
        }
    }
    return NULL;
}

/* The server's Pss, asked over a connection of its own. */
static long server_pss(const struct sockaddr_in *a) {
    unsigned char hdr[5] = {'M', 1, 0, 0, 0};
    int64_t v;
    int c = dial(a);
    if (full(c, hdr, 5, 0) || full(c, &v, 8, 1)) die("the server's Pss");
    close(c);
    return (long)v;
}

/* hold: see the top. */
static int hold(const struct sockaddr_in *a, int n, double secs) {
    int *fd = calloc((size_t)n, sizeof *fd);
    unsigned char msg[64] = {'H', 64, 0, 0, 0};
    if (!fd) die("calloc");
    long s0 = server_pss(a), c0 = pss_kib();
    for (int i = 0; i < n; i++) {
        fd[i] = dial(a);
        if (full(fd[i], msg, 5, 0)) die("send");
    }
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < n; i++)
            if (full(fd[i], msg, 64, 0) || full(fd[i], msg, 64, 1)) die("echo");
        if (round == 0) idle(secs);
    }
    long c1 = pss_kib(), s1 = server_pss(a);
    printf("{\"conns\": %d, \"client_kib\": %ld, \"server_kib\": %ld, \"kib_per_conn\": %.1f}\n",
           n, c1 - c0, s1 - s0, (double)(c1 - c0 + s1 - s0) / n);
    for (int i = 0; i < n; i++) close(fd[i]);
    return 0;
}

/* A field of /proc/self/status in KiB (VmPin, VmRSS); -1 if it has none. */
static long status_kib(const char *field) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    size_t n = strlen(field);
    if (!f) die("/proc/self/status");
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, field, n) && line[n] == ':' && sscanf(line + n + 1, "%ld", &v) == 1) break;
    fclose(f);
    return v;
}

/* burst: see the top. */
static int burst(const struct sockaddr_in *a, int n, double secs) {
    int *fd = calloc((size_t)n, sizeof *fd);
    unsigned char msg[64] = {'H', 64, 0, 0, 0};
    if (!fd) die("calloc");
    double t0 = now();
    /* (the mode's header at once: a threaded server peeks at it before its next accept) */
    for (int i = 0; i < n; i++)
        if (full(fd[i] = dial(a), msg, 5, 0)) die("send");
    for (int i = 0; i < n; i++)
        if (full(fd[i], msg, 64, 0) || full(fd[i], msg, 64, 1)) die("echo");
    printf("{\"burst_ms\": %.1f, \"conns\": %d}\n", (now() - t0) * 1e3, n);
    fflush(stdout);
    idle(secs);
    double *rtt = calloc((size_t)n, sizeof *rtt);
    if (!rtt) die("calloc");
    t0 = now();
    for (int i = 0; i < n; i++) {
        double t = now();
        if (full(fd[i], msg, 64, 0) || full(fd[i], msg, 64, 1)) die("echo");
        rtt[i] = now() - t;
    }
    double total = now() - t0;
    qsort(rtt, (size_t)n, sizeof *rtt, cmp);
    printf("{\"echo_ms\": %.1f, \"rtt_p50_us\": %.1f, \"rtt_p99_us\": %.1f, \"pinned_kib\": %ld, \"rss_kib\": %ld}\n",
           total * 1e3, rtt[n / 2] * 1e6, rtt[(size_t)(n * 0.99)] * 1e6, status_kib("VmPin"), status_kib("VmRSS"));
    fflush(stdout);
    for (int i = 0; i < n; i++) close(fd[i]);
    return 0;
}

/* multi: see the top. One connection's two sides in this process. */
struct busy {
    int c, sends;
    uint32_t size;
    double from, until; /* the counted window, this process's clock */
    struct received got; /* .counted: bytes from the server within it; .last8: the server's count */
};

static void *busy_send(void *arg) {
    struct busy *b = arg;
    char *buf = calloc(1, b->size);
    if (!buf) die("calloc");
    if (b->sends) {
        while (now() < b->until)
            if (full(b->c, buf, b->size, 0)) die("send");
    } else {
        idle(b->until - now());
    }
    if (shutdown(b->c, SHUT_WR)) die("shutdown");
    free(buf);
    return NULL;
}

static void *busy_recv(void *arg) {
    struct busy *b = arg;
    char *buf = malloc(b->size);
    if (!buf) die("malloc");
    b->got = receive_counting(b->c, buf, b->size, b->from, b->until);
    errno = 0;
    if (b->got.error || b->got.total < 8) die("a busy connection's stream");
    free(buf);
    return NULL;
}

/* The ping-pong among the busy connections: 64 B round trips through the window, those that
 * start within it timed (the time-stamp counter as in pp, its rate taken over the window). */
struct pingpong {
    int c;
    double from, until;
    double *rtt;
    size_t n;
    int tsc;
};

static void *pingpong_run(void *arg) {
    struct pingpong *p = arg;
    char msg[64] = {0};
    size_t cap = 1 << 16;
    double t_first = 0, t_last = 0;
    uint64_t k_first = 0, k_last = 0;
    p->rtt = malloc(cap * sizeof *p->rtt);
    if (!p->rtt) die("malloc");
    for (;;) {
        double t = now();
        uint64_t k = ticks();
        if (t >= p->until) { t_last = t, k_last = k; break; }
        if (full(p->c, msg, sizeof msg, 0) || full(p->c, msg, sizeof msg, 1)) die("the ping-pong");
        if (t < p->from) continue;
        if (t_first == 0) t_first = t, k_first = k;
        push(&p->rtt, &p->n, &cap, p->tsc ? (double)(ticks() - k) : now() - t);
    }
    if (p->tsc && p->n) {
        double hz = (double)(k_last - k_first) / (t_last - t_first);
        check_rate(hz);
        for (size_t i = 0; i < p->n; i++) p->rtt[i] /= hz;
    }
    return NULL;
}

static int multi(const struct sockaddr_in *a, int k, uint32_t size, double secs, char mode, double warmup) {
    struct busy *b = calloc((size_t)k, sizeof *b);
    pthread_t *th = calloc((size_t)k * 2 + 1, sizeof *th);
    if (!b || !th) die("calloc");
    for (int i = 0; i < k; i++) b[i].c = dial(a);
    struct pingpong pp = {.c = dial(a), .tsc = tsc_wanted()};
    unsigned char php[5] = {'P', 64, 0, 0, 0};
    if (full(pp.c, php, 5, 0)) die("send");
    /* (the window starts once all are open: dialling is not counted) */
    double from = now() + warmup, until = from + secs, off = wall_offset();
    pthread_attr_t small;
    pthread_attr_init(&small);
    pthread_attr_setstacksize(&small, 256 << 10);
    /* (every header before any stream starts: the streams would slow the later headers) */
    for (int i = 0; i < k; i++) {
        unsigned char hdr[5 + 2 * sizeof(double)] = {(unsigned char)mode};
        double w[2] = {from + off, until + off};
        memcpy(hdr + 1, &size, 4);
        memcpy(hdr + 5, w, sizeof w);
        if (full(b[i].c, hdr, sizeof hdr, 0)) die("send");
        b[i].size = size, b[i].from = from, b[i].until = until, b[i].sends = mode != 'D';
    }
    for (int i = 0; i < k; i++) {
        if (pthread_create(&th[2 * i], &small, busy_send, &b[i]) ||
            pthread_create(&th[2 * i + 1], &small, busy_recv, &b[i]))
            die("pthread_create");
    }
    pp.from = from, pp.until = until;
    if (pthread_create(&th[2 * k], &small, pingpong_run, &pp)) die("pthread_create");
    for (int i = 0; i < 2 * k + 1; i++) pthread_join(th[i], NULL);
    close(pp.c);
    uint64_t up = 0, down = 0;
    double lo = 0, hi = 0;
    for (int i = 0; i < k; i++) {
        double g = (double)(b[i].got.last8 + b[i].got.counted) * 8 / secs / 1e9;
        up += b[i].got.last8, down += b[i].got.counted;
        if (i == 0 || g < lo) lo = g;
        if (i == 0 || g > hi) hi = g;
        close(b[i].c);
    }
    /* (a ping-pong starved of every round trip in the window is a result, not an error:
     * its latencies are null) */
    char p50[32] = "null", p99[32] = "null";
    if (pp.n) {
        qsort(pp.rtt, pp.n, sizeof *pp.rtt, cmp);
        snprintf(p50, sizeof p50, "%.3f", pp.rtt[pp.n / 2] / 2 * 1e6);
        snprintf(p99, sizeof p99, "%.3f", pp.rtt[(size_t)(pp.n * 0.99)] / 2 * 1e6);
    }
    printf("{\"mode\": \"%s\", \"conns\": %d, \"gbit_s\": %.4f, \"up_gbit_s\": %.4f, \"down_gbit_s\": %.4f, "
           "\"min_conn_gbit_s\": %.4f, \"max_conn_gbit_s\": %.4f, \"p50_us\": %s, \"p99_us\": %s, \"samples\": %zu, \"tsc\": %d}\n",
           mode == 'U' ? "up" : mode == 'D' ? "down" : "both", k, (double)(up + down) * 8 / secs / 1e9,
           (double)up * 8 / secs / 1e9, (double)down * 8 / secs / 1e9, lo, hi, p50, p99, pp.n, pp.tsc);
    return 0;
}

/* The ping-pong in turns (SOCKBENCH_TURNS=R,W; see the header). */
static int pp_turns(int c, char *buf, uint32_t size, const char *spec) {
    int rfd, wfd;
    if (sscanf(spec, "%d,%d", &rfd, &wfd) != 2) { errno = EINVAL; die("SOCKBENCH_TURNS=R,W"); }
    const char *sl = getenv("SOCKBENCH_SLICE_MS");
    double slice = sl ? atof(sl) / 1e3 : 0.05;
    if (!(slice > 0 && slice < 60)) { errno = EINVAL; die("SOCKBENCH_SLICE_MS"); }
    int tsc = tsc_wanted();
    size_t cap = 1 << 16, turns = 0, mcap = 64;
    double *rtt = malloc(cap * sizeof *rtt), *med = malloc(mcap * sizeof *med);
    if (!rtt || !med) die("malloc");
    double t0 = now();
    uint64_t k0 = ticks();
    for (;;) {
        char go;
        ssize_t r = read(rfd, &go, 1);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) die("turn: read");
        if (r == 0) break;
        size_t n = 0;
        double end = now() + slice;
        for (unsigned long i = 0;; i++) {
            /* (the clock every 64th round trip) */
            if (i % 64 == 0 && now() >= end) break;
            double t = tsc ? 0 : now();
            uint64_t k = tsc ? ticks() : 0;
            if (full(c, buf, size, 0)) die("send");
            if (full(c, buf, size, 1)) die("recv");
            push(&rtt, &n, &cap, tsc ? (double)(ticks() - k) : now() - t);
        }
        push(&med, &turns, &mcap, median(rtt, n));
        while (write(wfd, &go, 1) != 1)
            if (errno != EINTR) die("turn: write");
    }
    /* (the counter's rate over the whole run, waits included: it counts at a constant rate) */
    double hz = tsc ? (double)(ticks() - k0) / (now() - t0) : 1;
    if (tsc) check_rate(hz);
    printf("{\"turns_us\": [");
    for (size_t i = 0; i < turns; i++) printf("%s%.3f", i ? ", " : "", med[i] / hz / 2 * 1e6);
    printf("], \"tsc\": %d}\n", tsc);
    return 0;
}

int main(int argc, char **argv) {
    int one = 1;
    if ((argc == 4 || (argc == 5 && !strcmp(argv[4], "epoll"))) && !strcmp(argv[1], "server")) {
        struct sigaction sa = {0};
        sa.sa_handler = on_signal; /* no SA_RESTART: accept() returns EINTR */
        sigaction(SIGTERM, &sa, NULL);
        sigaction(SIGINT, &sa, NULL);
        signal(SIGPIPE, SIG_IGN); /* (a busy client gone mid-stream: its send fails, no more) */
        struct sockaddr_in a = addr(argv[2], argv[3]);
        int l = socket(AF_INET, SOCK_STREAM, 0);
        setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (l < 0 || bind(l, (void *)&a, sizeof a) || listen(l, 65535)) die("listen");
        struct loop *lp = NULL;
        pthread_t t;
        if (argc == 5) {
            lp = loop_new();
            if (pthread_create(&t, NULL, held_loop, lp)) die("pthread_create");
        }
        /* (held connections' threads: thousands of them in a burst, each needing little) */
        pthread_attr_t small;
        pthread_attr_init(&small);
        pthread_attr_setstacksize(&small, 256 << 10);
        while (!stop) {
            int c = accept(l, NULL, NULL);
            if (c < 0) {
                if (errno == EINTR) continue;
                die("accept");
            }
            setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            if (lp) {
                loop_add(lp, c);
                continue;
            }
            /* (a held or busy connection gets a thread: the others are served one at a time) */
            unsigned char h;
            if (recv(c, &h, 1, MSG_PEEK) == 1 && strchr("HUDB", h) && h &&
                !pthread_create(&t, &small, serve_thread, (void *)(intptr_t)c)) {
                pthread_detach(t);
                continue;
            }
            serve(c);
            close(c);
        }
        close(l);
        return 0;
    }
    if (argc == 7 && !strcmp(argv[1], "client") && !strcmp(argv[4], "hold")) {
        struct sockaddr_in a = addr(argv[2], argv[3]);
        int n = atoi(argv[5]);
        if (n <= 0) { errno = EINVAL; die("hold: N"); }
        return hold(&a, n, atof(argv[6]));
    }
    if (argc == 7 && !strcmp(argv[1], "client") && !strcmp(argv[4], "burst")) {
        struct sockaddr_in a = addr(argv[2], argv[3]);
        int n = atoi(argv[5]);
        if (n <= 0) { errno = EINVAL; die("burst: N"); }
        return burst(&a, n, atof(argv[6]));
    }
    if ((argc == 9 || argc == 10) && !strcmp(argv[1], "client") && !strcmp(argv[4], "multi")) {
        struct sockaddr_in a = addr(argv[2], argv[3]);
        int k = atoi(argv[5]);
        long size = atol(argv[6]);
        double secs = atof(argv[7]), warmup = argc == 10 ? atof(argv[9]) : 2;
        const char *m = argv[8];
        char mode = !strcmp(m, "up") ? 'U' : !strcmp(m, "down") ? 'D' : !strcmp(m, "both") ? 'B' : 0;
        errno = EINVAL;
        if (k <= 0 || k > 10000) die("multi: K");
        if (size <= 0 || size > (1 << 24)) die("multi: SIZE");
        if (!(secs > 0 && secs < 3000) || !(warmup >= 0 && warmup < 600)) die("multi: SECONDS, WARMUP");
        if (!mode) die("multi: up, down or both");
        return multi(&a, k, (uint32_t)size, secs, mode, warmup);
    }
    int conn = argc >= 5 && !strcmp(argv[4], "conn"), first = argc >= 5 && !strcmp(argv[4], "first");
    if ((argc != 7 && !(!first && argc == 8)) || strcmp(argv[1], "client") ||
        (strcmp(argv[4], "pp") && strcmp(argv[4], "stream") && !conn && !first)) {
        fprintf(stderr, "usage: sockbench server IP PORT [epoll] | sockbench client IP PORT pp|stream|conn|first SIZE SECONDS [WARMUP] | sockbench client IP PORT hold|burst N SECONDS | sockbench client IP PORT multi K SIZE SECONDS up|down|both [WARMUP]\n");
        return 2;
    }
    int pp = !strcmp(argv[4], "pp");
    uint32_t size = (uint32_t)atoi(argv[5]);
    double secs = atof(argv[6]);
    if (size == 0 || size > (1u << 24)) { errno = EINVAL; die("size"); }
    double warmup = argc == 8 ? atof(argv[7]) : 0;
    struct sockaddr_in a = addr(argv[2], argv[3]);
    if (conn || first) {
        char *msg = calloc(1, size + 5);
        if (!msg) die("malloc");
        msg[0] = 'C';
        memcpy(msg + 1, &size, 4);
        if (first) {
            double t0 = now();
            one_conn(&a, msg, size);
            double t = now() - t0;
            idle(secs);
            printf("{\"first_ms\": %.3f, \"cpu_ms\": %.3f}\n", t * 1e3, cpu_now() * 1e3);
            return 0;
        }
        for (double w = now() + warmup; now() < w;) one_conn(&a, msg, size);
        long n = 0;
        double t0 = now(), end = t0 + secs;
        while (now() < end) {
            one_conn(&a, msg, size);
            n++;
        }
        double t = now() - t0;
        printf("{\"conn_s\": %.1f, \"connections\": %ld, \"seconds\": %.3f, \"warmup\": %.3f}\n", n / t, n, t, warmup);
        return 0;
    }
    int c = dial(&a);
    unsigned char hdr[5] = {pp ? 'P' : 'S'};
    memcpy(hdr + 1, &size, 4);
    if (full(c, hdr, 5, 0)) die("send");
    char *buf = calloc(1, size);
    if (!buf) die("malloc");
    const char *turns = getenv("SOCKBENCH_TURNS");
    if (pp && turns) return pp_turns(c, buf, size, turns);
    if (pp) {
        size_t cap = 1 << 16, n = 0;
        double *rtt = malloc(cap * sizeof *rtt), w = now() + warmup, t0 = 0, end = 0;
        long warm = 100;
        int tsc = tsc_wanted();
        uint64_t k0 = 0, kmid = 0;
        double tmid = 0, cpu0 = 0;
        for (unsigned long i = 0;; i++) {
            /* (with the counter, the clock only every 64th round trip: for the run's end) */
            double t = tsc && t0 != 0 && i % 64 ? t0 : now();
            uint64_t k = tsc ? ticks() : 0;
            if (warm == 0 && t0 == 0) t0 = t, end = t0 + secs, k0 = k, cpu0 = cpu_now();
            if (t0 != 0 && t >= end) break;
            if (t0 != 0 && tmid == 0 && t >= t0 + secs / 2) tmid = t, kmid = k;
            if (full(c, buf, size, 0)) die("send");
            if (full(c, buf, size, 1)) die("recv");
            if (warm > 0) { if (warm > 1 || now() >= w) warm--; continue; }
            push(&rtt, &n, &cap, tsc ? (double)(ticks() - k) : now() - t);
        }
        if (n == 0) { errno = 0; fprintf(stderr, "sockbench: no sample after warm-up\n"); return 1; }
        double cpu_us = (cpu_now() - cpu0) / n * 1e6;
        if (tsc) {
            /* counter ticks per second over the counted run, and over each half of it */
            double t1 = now();
            uint64_t k1 = ticks();
            double hz = (double)(k1 - k0) / (t1 - t0), h1 = 0, h2 = 0;
            if (tmid > t0 && t1 > tmid) h1 = (double)(kmid - k0) / (tmid - t0), h2 = (double)(k1 - kmid) / (t1 - tmid);
            if (!(hz > 5e7 && hz < 2e10) || !(h1 > 0.98 * h2 && h1 < 1.02 * h2)) {
                errno = 0;
                fprintf(stderr, "sockbench: the time-stamp counter's rate is not constant (%.0f, %.0f Hz over the two halves): run with SOCKBENCH_CLOCK=mono\n", h1, h2);
                return 1;
            }
            for (size_t i = 0; i < n; i++) rtt[i] /= hz;
        }
        const char *sl = getenv("SOCKBENCH_SLICE_MS");
        double slice = sl ? atof(sl) / 1e3 : 0;
        printf("{");
        if (slice > 0) {
            /* (the samples are in order and back to back: a slice ends where their sum does) */
            printf("\"slices_us\": [");
            double *part = malloc(n * sizeof *part), sum = 0;
            if (!part) die("malloc");
            for (size_t i = 0, from = 0, k = 0; i < n; i++) {
                sum += rtt[i];
                if (sum < slice && i + 1 < n) continue;
                size_t m = i + 1 - from;
                memcpy(part, rtt + from, m * sizeof *part);
                printf("%s%.3f", k++ ? ", " : "", median(part, m) / 2 * 1e6);
                from = i + 1, sum = 0;
            }
            printf("], ");
            free(part);
        }
        qsort(rtt, n, sizeof *rtt, cmp);
        printf("\"p50_us\": %.3f, \"p99_us\": %.3f, \"samples\": %zu, \"tsc\": %d, \"cpu_us\": %.3f}\n",
               rtt[n / 2] / 2 * 1e6, rtt[(size_t)(n * 0.99)] / 2 * 1e6, n, tsc, cpu_us);
    } else {
        uint64_t before = 0;
        for (double w = now() + warmup; now() < w; before += size)
            if (full(c, buf, size, 0)) die("send");
        double t0 = now(), end = t0 + secs;
        while (now() < end)
            if (full(c, buf, size, 0)) die("send");
        if (shutdown(c, SHUT_WR)) die("shutdown");
        uint64_t total;
        if (full(c, &total, 8, 1)) die("recv of the server's count");
        double t = now() - t0;
        total -= before;
        printf("{\"gbit_s\": %.4f, \"bytes\": %llu, \"seconds\": %.3f, \"warmup\": %.3f}\n",
               total * 8 / t / 1e9, (unsigned long long)total, t, warmup);
    }
    close(c);
    return 0;
}

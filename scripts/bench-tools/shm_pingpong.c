/* shm_pingpong.c -- the same-host floor: a ping-pong between two processes with nothing but
 * the bytes in shared memory, the "device" the shim's shared-memory rings are measured against
 * (docs/bench/kinds.md; scripts/bench-tools/ab-latency with LOCAL=1).
 *
 *   shm_pingpong SIZE SECONDS [WARMUP] [SERVER_CPU CLIENT_CPU]
 *
 * Each side owns a 1 MiB ring in a shared anonymous mapping that the other side writes: a
 * message is SIZE bytes copied into the ring at its head, then the head published with a
 * release store; the receiver spins on the head (with the spin-loop hint, as the shim's spin
 * does), copies the bytes out and answers with them the same way; the client checks that each
 * answer's first and last 8 bytes are those of the message it sent (its sequence number and
 * the number's complement), outside the timed part. That is the least any stream between two
 * processes of one host does per message: a copy in, a published cursor, a copy out — no
 * framing, no system call, and the reader's published tail read by the writer only once a lap
 * (when its last copy of it would not let the next message in).
 *
 * Prints one JSON line, as `sockbench client ... pp` does: the median and 99th percentile of
 * the one-way latency (round trip / 2) in microseconds, over the round trips started within
 * SECONDS after WARMUP seconds (default 1) of uncounted ones, timed with the CPU's time-stamp
 * counter (its rate taken from the monotonic clock over the run):
 * {"p50_us":..,"p99_us":..,"samples":..,"tsc":1}. The server process runs on SERVER_CPU and
 * the client on CLIENT_CPU when given (default: unpinned). x86-64 only. */
#define _GNU_SOURCE
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

#define RING (1u << 20)
#define MAX_SIZE 65536u

struct inbox {
    _Alignas(64) _Atomic uint64_t head; /* bytes written into ring (by the peer) */
    _Alignas(64) _Atomic uint64_t tail; /* bytes read out of ring (by the owner) */
    _Alignas(64) unsigned char ring[RING];
};

/* How many of SIZE bytes at stream position POS fit before the ring's end (the rest wrap to its
 * start). */
static uint32_t before_end(uint64_t pos, uint32_t size) {
    uint32_t room = RING - (uint32_t)(pos % RING);
    return size < room ? size : room;
}

static double mono(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void pin(int cpu) {
    if (cpu < 0) return;
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    if (sched_setaffinity(0, sizeof s, &s)) perror("shm_pingpong: sched_setaffinity");
}

/* SIZE bytes from msg into box at its head, wrapping around the ring; then published. The
 * reader's tail is read again only when the writer's last copy of it would not let the bytes
 * in (once a lap), as a credited stream looks at credit only when it runs short. */
static void put(struct inbox *box, const unsigned char *msg, uint32_t size, uint64_t *tail) {
    uint64_t h = atomic_load_explicit(&box->head, memory_order_relaxed);
    while (h + size - *tail > RING) {
        *tail = atomic_load_explicit(&box->tail, memory_order_acquire);
        if (h + size - *tail > RING) _mm_pause();
    }
    uint32_t first = before_end(h, size);
    memcpy(box->ring + h % RING, msg, first);
    memcpy(box->ring, msg + first, size - first);
    atomic_store_explicit(&box->head, h + size, memory_order_release);
}

/* The next SIZE bytes of box into msg, once published (a spin); 1 if `stop` was seen instead. */
static int take(struct inbox *box, unsigned char *msg, uint32_t size, volatile int *stop) {
    uint64_t t = atomic_load_explicit(&box->tail, memory_order_relaxed);
    while (atomic_load_explicit(&box->head, memory_order_acquire) - t < size) {
        if (stop && *stop) return 1;
        _mm_pause();
    }
    uint32_t first = before_end(t, size);
    memcpy(msg, box->ring + t % RING, first);
    memcpy(msg + first, box->ring, size - first);
    atomic_store_explicit(&box->tail, t + size, memory_order_release);
    return 0;
}

static int cmp(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: shm_pingpong SIZE SECONDS [WARMUP] [SERVER_CPU CLIENT_CPU]\n");
        return 2;
    }
    uint32_t size = (uint32_t)atoi(argv[1]);
    double secs = atof(argv[2]), warm = argc > 3 ? atof(argv[3]) : 1;
    int scpu = argc > 5 ? atoi(argv[4]) : -1, ccpu = argc > 5 ? atoi(argv[5]) : -1;
    if (size < 8 || size > MAX_SIZE || secs <= 0) {
        fprintf(stderr, "shm_pingpong: SIZE 8..%u bytes, SECONDS > 0\n", MAX_SIZE);
        return 2;
    }
    /* [0]: the server's inbox, [1]: the client's; [2]'s first word: the client's "stop" */
    struct inbox *box = mmap(0, 3 * sizeof *box, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (box == MAP_FAILED) { perror("shm_pingpong: mmap"); return 1; }
    volatile int *stop = (volatile int *)&box[2].head;
    static unsigned char msg[MAX_SIZE];
    pid_t server = fork();
    if (server < 0) { perror("shm_pingpong: fork"); return 1; }
    if (server == 0) {
        pin(scpu);
        uint64_t tail = 0;
        while (!take(&box[0], msg, size, stop)) put(&box[1], msg, size, &tail);
        _exit(0);
    }
    pin(ccpu);
    size_t cap = 1 << 20, n = 0;
    uint64_t *rtt = malloc(cap * sizeof *rtt);
    if (!rtt) { perror("shm_pingpong: malloc"); return 1; }
    double t0 = mono(), from = t0 + warm, until = from + secs;
    uint64_t c0 = __rdtsc();
    int bad = 0;
    uint64_t tail = 0;
    for (uint64_t seq = 0;; seq++) {
        double now = mono();
        if (now >= until) break;
        uint64_t last = ~seq;
        memcpy(msg, &seq, sizeof seq);
        memcpy(msg + size - sizeof last, &last, sizeof last);
        uint64_t a = __rdtsc();
        put(&box[0], msg, size, &tail);
        take(&box[1], msg, size, NULL);
        uint64_t b = __rdtsc();
        uint64_t back, back_last;
        memcpy(&back, msg, sizeof back);
        memcpy(&back_last, msg + size - sizeof back_last, sizeof back_last);
        if (back != seq || back_last != last) { bad = 1; break; }
        if (now >= from) {
            if (n == cap) {
                uint64_t *more = realloc(rtt, 2 * cap * sizeof *rtt);
                if (!more) break;
                rtt = more, cap *= 2;
            }
            rtt[n++] = b - a;
        }
    }
    double hz = (__rdtsc() - c0) / (mono() - t0);
    *stop = 1;
    waitpid(server, NULL, 0);
    if (bad) { fprintf(stderr, "shm_pingpong: an answer that is not the message sent\n"); return 1; }
    if (!n) { fprintf(stderr, "shm_pingpong: no round trip counted\n"); return 1; }
    qsort(rtt, n, sizeof *rtt, cmp);
    printf("{\"p50_us\": %.3f, \"p99_us\": %.3f, \"samples\": %zu, \"tsc\": 1}\n",
           rtt[n / 2] / hz / 2 * 1e6, rtt[n * 99 / 100] / hz / 2 * 1e6, n);
    return 0;
}

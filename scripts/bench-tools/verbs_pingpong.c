/* verbs_pingpong.c -- the smallest RDMA ping-pong of each way a receiver can learn that data
 * arrived, for scripts/bench-transport: what the wire pattern costs on the device, apart from
 * any protocol or software around it.
 *
 *   verbs_pingpong server IP PORT MODE ITERS [SIZE]
 *   verbs_pingpong client IP PORT MODE ITERS [SIZE]
 *                          prints one_way_us=<median round trip / 2> and p99_us=<99th / 2>
 *
 * Each MODE is the wire pattern of one kind of connection (issue 29), SIZE bytes a message
 * (default 64):
 * MODE write: RDMA WRITE into the peer's buffer; the receiver spins on the last byte of the
 *             slot (ib_write_lat's way; no receive is consumed, no completion): the pattern of
 *             a ring written with plain WRITEs whose receiver polls a trailer in ring memory.
 * MODE imm:   RDMA WRITE WITH IMMEDIATE; the receiver spins on its completion queue and posts
 *             the consumed receive again at once (the ring stream's wire pattern, protocol.md
 *             section 3, with nothing else around it).
 * MODE send:  SEND into one of the receiver's posted buffers (64 of SIZE bytes); the receiver
 *             spins on its completion queue, copies the message out of the buffer (as a
 *             stream over posted buffers must, into its reader's memory) and posts the buffer
 *             again (ib_send_lat's pattern plus the copy).
 * MODE srq:   as send, the buffers posted to a shared receive queue instead of the QP's own.
 * MODE mailbox: RDMA WRITE of the message into the peer's buffer, then, chained in the same
 *             post, an 8-byte WRITE of the count of messages sent so far into a word of the
 *             peer's (its "mailbox", apart from the buffer); the receiver spins on that word,
 *             then checks the message's tag (the two WRITEs placed in order). The pattern of a
 *             byte-stream ring written with plain WRITEs whose receiver polls a cursor: unlike
 *             `write`'s trailer in the slot, the receiver need not know where a message ends.
 * MODE atomic: RDMA WRITE of the message into the peer's buffer, then, chained in the same
 *             post, an RDMA ATOMIC FETCH AND ADD of 1 on a word of the peer's; the receiver
 *             spins on that word, then checks the message's tag. The pattern of a ring whose
 *             cursor the writer advances with an atomic (the prototype's `write_atomic`): the
 *             mailbox's, with an atomic (which the responder answers with the old value)
 *             in place of the cursor's WRITE.
 * MODE read:  the sender puts the message in its own registered buffer and tells the
 *             receiver with a zero-length WRITE WITH IMMEDIATE (the slot in the immediate);
 *             the receiver pulls it with an RDMA READ into its buffer, waits for the READ's
 *             completion, and answers the same way (a reader that pulls when told).
 * All: sends inline when SIZE <= 64, one signaled every 16 (its completion awaited, so the
 * send queue never fills; a READ is always signaled), separate send and receive CQs, never
 * armed. Slot i mod S (S = buffer / SIZE, at most 1000, never a multiple of 251) of a 64 KiB
 * (or 16 x SIZE) buffer carries tag i mod 251 + 1 in its last byte, so a slot's previous tag
 * never matches; every received message's tag is checked. Round trips are timed with the
 * time-stamp counter (as perftest times ib_write_lat), its rate taken from CLOCK_MONOTONIC
 * over the run: under the VM's HPET clocksource a clock read is a system call. The first tenth
 * of the iterations are a warm-up. Errors: a message and exit status 1.
 *
 * Knobs (environment, both ends alike), to move the setup towards rdmashim's own endpoint one
 * difference at a time: VPP_SIGNAL=N (a signaled send every N, default 16; rdmashim: its send
 * queue depth / 4), VPP_SQ=N (send queue depth, default 2 * VPP_SIGNAL; rdmashim: 128),
 * VPP_SHARED_CQ=1 (one CQ for sends and receives, created with a completion channel that is
 * never armed, as rdmashim's; default: two CQs, no channel), VPP_BUF=BYTES (bytes registered
 * per buffer, default 65536; rdmashim's ring: 1 MiB, mapped twice). VPP_WORK_NS=N: each side
 * busy-waits N ns between a message's arrival and its answer, standing in for the software a
 * real stack runs there (does latency grow by N, or by more?).
 *
 * VPP_STREAM=1 (modes write and imm): a one-way stream instead of the ping-pong, the pattern of
 * a ring's bulk transfer with nothing else around it. The client writes ITERS messages of SIZE
 * bytes into successive slots of the server's buffer (VPP_BUF bytes, a ring of its slots), at
 * most VPP_SQ work requests in flight, and may write a slot again only once the server
 * returned it: the server checks each message's tag (write: it spins on the slot's last byte;
 * imm: on its completion queue, the receive posted again at once) and returns credit, a
 * zero-length WRITE WITH IMMEDIATE carrying its count of messages taken, every VPP_CREDIT
 * messages (default: a quarter of the slots, as the ring returns credit per quarter of its
 * size) and after the last. The client prints mib_s=<MiB a second> from its first message
 * after the warm-up to the credit for the last, and credits=<credits it took>.
 * VPP_SAME_SLOT=1 (imm only) writes every message into slot 0, as ib_write_bw writes one
 * buffer again and again (the tags are not checked then: a slot may hold a later message's).
 * VPP_SLEEP=1 (imm only): the server does not spin for a message it waits for; it arms its
 * completion queue and sleeps on the completion channel (as ib_write_bw's server leaves its
 * CPU alone, and rdmashim's reader sleeps once its spin runs out).
 */
#define _GNU_SOURCE
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

#define INLINE_MAX 64
#define SLOTS_MAX 1000
#define RECVS 64

enum mode { WRITE, IMM, SEND, SRQ, READ, MAILBOX, ATOMIC };
static const char *const mode_names[] = {"write", "imm", "send", "srq", "read", "mailbox", "atomic"};
#define MODES 7

static long knob(const char *name, long dflt) {
    const char *v = getenv(name);
    return v && *v ? atol(v) : dflt;
}

static void die(const char *what) {
    perror(what);
    exit(1);
}

static int cmp(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static double mono(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* what a side tells its peer: its receiving buffer (WRITE targets) and its sending one (READ
 * sources) */
struct area {
    uint64_t addr;
    uint64_t src;
    uint64_t mbox;
    uint32_t rkey;
    uint32_t src_rkey;
    uint32_t mbox_rkey;
};

/* the mailbox (mode mailbox): the peer writes its count of messages sent here; this side's
 * count for the peer's is sent inline (copied at the post: the next count cannot overtake it).
 * Mode atomic: the peer adds 1 to it per message; the old value comes back into mbox_out. */
static volatile uint64_t mbox_in __attribute__((aligned(64)));
static uint64_t mbox_out __attribute__((aligned(64)));
static struct ibv_mr *mbox_in_mr, *mbox_out_mr;

static struct rdma_cm_id *id;
static struct ibv_cq *send_cq, *recv_cq;
static struct ibv_comp_channel *channel;
static long signal_every;
/* the wr_id of the last send completion taken (the stream's sender retires every work request
 * up to it) */
static uint64_t last_send_id;
static uint64_t work_ticks;

/* busy-waits `work_ticks` counter ticks */
static void work(void) {
    if (!work_ticks) return;
    uint64_t end = __rdtsc() + work_ticks;
    while (__rdtsc() < end)
        ;
}

static struct ibv_mr *src_mr, *dst_mr, *bufs_mr;
static char *src, *dst, *bufs, *app;
static struct area peer;
static enum mode mode;
static long size, slots;
static struct ibv_srq *srq;

/* posts receive `wr_id`: for send and srq, buffer wr_id of `bufs` (SIZE bytes); otherwise no
 * buffer (a WRITE WITH IMMEDIATE's receive takes no bytes) */
static void post_recv(uint64_t wr_id) {
    struct ibv_sge sge = {(uintptr_t)(bufs + wr_id * size), (uint32_t)size, bufs_mr ? bufs_mr->lkey : 0};
    struct ibv_recv_wr wr = {.wr_id = wr_id}, *bad;
    if (mode == SEND || mode == SRQ) {
        wr.sg_list = &sge;
        wr.num_sge = 1;
    }
    if (srq ? ibv_post_srq_recv(srq, &wr, &bad) : ibv_post_recv(id->qp, &wr, &bad)) die("ibv_post_recv");
}

/* the last receive's completion: its buffer (wr_id), immediate and length */
static struct ibv_wc last_recv;

/* completions seen and not yet waited for: sends, receives (with a shared CQ, either may
 * turn up while the other is waited for) */
static long sends_done, recvs_done, reads_done;

/* takes one completion from `cq`, if any: counts it (a receive is posted again at once) */
static void take(struct ibv_cq *cq) {
    struct ibv_wc wc;
    int n = ibv_poll_cq(cq, 1, &wc);
    if (n < 0) die("ibv_poll_cq");
    if (n == 0) return;
    if (wc.status != IBV_WC_SUCCESS) {
        fprintf(stderr, "verbs_pingpong: completion status %s\n", ibv_wc_status_str(wc.status));
        exit(1);
    }
    if (wc.opcode & IBV_WC_RECV) {
        recvs_done++;
        last_recv = wc;
        /* (a data receive without bytes goes back at once; one with bytes once they are
         * copied out, by recv_msg) */
        if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) post_recv(wc.wr_id);
    } else if (wc.opcode == IBV_WC_RDMA_READ) {
        /* (apart from the sends: a signaled notice's completion must not stand for it) */
        reads_done++;
    } else {
        sends_done++;
        last_send_id = wc.wr_id;
    }
}

static void await_send(void) {
    while (sends_done == 0) take(send_cq);
    sends_done--;
}

static void await_read(void) {
    while (reads_done == 0) take(send_cq);
    reads_done--;
}

static void await_recv(void) {
    while (recvs_done == 0) take(recv_cq);
    recvs_done--;
}

/* the tag message i carries in its last byte */
static char tag(long i) { return (char)(i % 251 + 1); }

static void check(const char *where, char got, long i) {
    if (got != tag(i)) {
        fprintf(stderr, "verbs_pingpong: message %ld: tag %d in %s, %d expected\n", i, got, where, tag(i));
        exit(1);
    }
}

static void send_msg(long i) {
    long slot = i % slots;
    src[slot * size + size - 1] = tag(i);
    struct ibv_sge sge = {(uintptr_t)(src + slot * size), (uint32_t)size, src_mr->lkey};
    struct ibv_send_wr wr = {0}, *bad;
    wr.wr_id = i;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = mode == WRITE || mode == MAILBOX || mode == ATOMIC ? IBV_WR_RDMA_WRITE
              : mode == IMM || mode == READ ? IBV_WR_RDMA_WRITE_WITH_IMM
                                             : IBV_WR_SEND;
    wr.imm_data = htonl((uint32_t)(mode == READ ? slot : i));
    if (mode == READ) wr.num_sge = 0; /* (the notice: no bytes, the slot in the immediate) */
    wr.send_flags = (size <= INLINE_MAX ? IBV_SEND_INLINE : 0) |
                    (i % signal_every == signal_every - 1 ? IBV_SEND_SIGNALED : 0);
    wr.wr.rdma.remote_addr = peer.addr + slot * size;
    wr.wr.rdma.rkey = peer.rkey;
    struct ibv_sge msge = {(uintptr_t)&mbox_out, sizeof mbox_out, mbox_out_mr ? mbox_out_mr->lkey : 0};
    struct ibv_send_wr mwr = {0};
    if (mode == MAILBOX || mode == ATOMIC) {
        /* (the message's WRITE is unsignaled: the chain's last completion stands for both) */
        mbox_out = (uint64_t)i + 1;
        mwr.wr_id = i;
        mwr.sg_list = &msge;
        mwr.num_sge = 1;
        mwr.send_flags = wr.send_flags & IBV_SEND_SIGNALED;
        if (mode == MAILBOX) {
            mwr.opcode = IBV_WR_RDMA_WRITE;
            mwr.send_flags |= IBV_SEND_INLINE;
            mwr.wr.rdma.remote_addr = peer.mbox;
            mwr.wr.rdma.rkey = peer.mbox_rkey;
        } else {
            mwr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
            mwr.wr.atomic.remote_addr = peer.mbox;
            mwr.wr.atomic.rkey = peer.mbox_rkey;
            mwr.wr.atomic.compare_add = 1;
        }
        wr.send_flags &= ~IBV_SEND_SIGNALED;
        wr.next = &mwr;
    }
    if (ibv_post_send(id->qp, &wr, &bad)) die("ibv_post_send");
    if (mode == MAILBOX || mode == ATOMIC) wr.send_flags |= mwr.send_flags & IBV_SEND_SIGNALED;
    if (wr.send_flags & IBV_SEND_SIGNALED) await_send();
}

static void recv_msg(long i) {
    long slot = i % slots;
    switch (mode) {
    case WRITE: {
        volatile char *last = dst + slot * size + size - 1;
        while (*last != tag(i))
            ;
        break;
    }
    case MAILBOX:
    case ATOMIC:
        while (mbox_in < (uint64_t)i + 1)
            ;
        check("the buffer, once the mailbox said", dst[slot * size + size - 1], i);
        break;
    case IMM:
        await_recv();
        check("the ring", dst[slot * size + size - 1], i);
        break;
    case SEND:
    case SRQ: {
        await_recv();
        if (last_recv.byte_len != (uint32_t)size) {
            fprintf(stderr, "verbs_pingpong: a receive of %u bytes, %ld expected\n", last_recv.byte_len, size);
            exit(1);
        }
        memcpy(app, bufs + last_recv.wr_id * size, size);
        post_recv(last_recv.wr_id);
        check("the copy", app[size - 1], i);
        break;
    }
    case READ: {
        await_recv();
        long at = ntohl(last_recv.imm_data);
        struct ibv_sge sge = {(uintptr_t)(dst + at * size), (uint32_t)size, dst_mr->lkey};
        struct ibv_send_wr wr = {0}, *bad;
        wr.wr_id = i;
        wr.sg_list = &sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_RDMA_READ;
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.wr.rdma.remote_addr = peer.src + at * size;
        wr.wr.rdma.rkey = peer.src_rkey;
        if (ibv_post_send(id->qp, &wr, &bad)) die("ibv_post_send (READ)");
        await_read();
        check("the read", dst[at * size + size - 1], i);
        break;
    }
    }
}

/* VPP_STREAM: the one-way stream (see the head of the file) */
static long same_slot;

/* posts message i's WRITE (WITH IMMEDIATE) into its slot; signaled every `signal_every` */
static void stream_post(long i) {
    long slot = same_slot ? 0 : i % slots;
    src[slot * size + size - 1] = tag(i);
    struct ibv_sge sge = {(uintptr_t)(src + slot * size), (uint32_t)size, src_mr->lkey};
    struct ibv_send_wr wr = {0}, *bad;
    wr.wr_id = (uint64_t)i;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = mode == IMM ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
    wr.imm_data = htonl((uint32_t)i);
    wr.send_flags = (size <= INLINE_MAX ? IBV_SEND_INLINE : 0) |
                    (i % signal_every == signal_every - 1 ? IBV_SEND_SIGNALED : 0);
    wr.wr.rdma.remote_addr = peer.addr + slot * size;
    wr.wr.rdma.rkey = peer.rkey;
    if (ibv_post_send(id->qp, &wr, &bad)) die("ibv_post_send");
}

/* the client's credits taken so far (their receives were posted again by `take`): the
 * server's count of messages taken, from the last one's immediate, into *credited; how many
 * came, added to *credits */
static void take_credits(long *credited, long *credits) {
    if (!recvs_done) return;
    *credits += recvs_done;
    recvs_done = 0;
    *credited = ntohl(last_recv.imm_data);
}

/* the client: returns the MiB a second from message `warm` to the credit for the last */
static double stream_send(long iters, long warm, long sq, long *credits) {
    long credited = 0, retired = 0, total = iters + warm;
    double t0 = 0;
    for (long i = 0; i < total; i++) {
        if (i == warm) t0 = mono();
        /* room in the send queue: a signaled completion retires every request up to it */
        while (i - retired >= sq - 1) {
            take(send_cq);
            if (sends_done) sends_done = 0, retired = (long)last_send_id + 1;
        }
        /* (credits taken as they come, their receives posted again, even when the ring has
         * room: with a CQ of their own nothing else would take them) */
        if (recv_cq != send_cq) take(recv_cq);
        take_credits(&credited, credits);
        /* room in the peer's ring: the slot was returned */
        while (!same_slot && i - credited >= slots) {
            take(recv_cq);
            take_credits(&credited, credits);
        }
        stream_post(i);
    }
    while (credited < total) {
        take(recv_cq);
        take_credits(&credited, credits);
    }
    double secs = mono() - t0;
    /* (the last signaled write's completion before the disconnect, if any was signaled:
     * message total - total % signal_every - 1) */
    while (total >= signal_every && (long)last_send_id + 1 < total - total % signal_every) take(send_cq);
    return (double)iters * size / secs / (1 << 20);
}

/* waits for a receive as await_recv does, asleep on the completion channel while none is
 * there */
static void sleep_recv(void) {
    while (recvs_done == 0) {
        take(recv_cq);
        if (recvs_done) break;
        if (ibv_req_notify_cq(recv_cq, 0)) die("ibv_req_notify_cq");
        take(recv_cq); /* (one that came before the CQ was armed) */
        if (recvs_done) break;
        struct ibv_cq *cq;
        void *ctx;
        if (ibv_get_cq_event(channel, &cq, &ctx)) die("ibv_get_cq_event");
        ibv_ack_cq_events(cq, 1);
    }
    recvs_done--;
}

/* the server: takes every message, returning credit every `credit_every` and after the last */
static void stream_recv(long total, long credit_every, int sleep) {
    long credits = 0;
    for (long i = 0; i < total; i++) {
        long slot = same_slot ? 0 : i % slots;
        if (mode == IMM) {
            if (sleep)
                sleep_recv();
            else
                await_recv();
            if (!same_slot) check("the ring", dst[slot * size + size - 1], i);
        } else {
            volatile char *last = dst + slot * size + size - 1;
            while (*last != tag(i))
                ;
        }
        if ((i + 1) % credit_every && i + 1 != total) continue;
        struct ibv_send_wr wr = {0}, *bad;
        wr.wr_id = (uint64_t)credits;
        wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
        wr.imm_data = htonl((uint32_t)(i + 1));
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.wr.rdma.remote_addr = peer.addr;
        wr.wr.rdma.rkey = peer.rkey;
        if (ibv_post_send(id->qp, &wr, &bad)) die("ibv_post_send (credit)");
        await_send();
        credits++;
    }
}

int main(int argc, char **argv) {
    int m = -1;
    for (int k = 0; argc >= 6 && k < MODES; k++)
        if (!strcmp(argv[4], mode_names[k])) m = k;
    size = argc == 7 ? atol(argv[6]) : 64;
    if ((argc != 6 && argc != 7) || (strcmp(argv[1], "server") && strcmp(argv[1], "client")) || m < 0 ||
        atol(argv[5]) < 10 || size < 1 || size > (1 << 20)) {
        fprintf(stderr, "usage: verbs_pingpong server|client IP PORT write|imm|send|srq|read|mailbox|atomic ITERS (>= 10) [SIZE (1..1048576)]\n");
        return 1;
    }
    mode = (enum mode)m;
    int server = !strcmp(argv[1], "server");
    long iters = atol(argv[5]), warm = iters / 10;

    struct rdma_addrinfo hints = {0}, *res;
    hints.ai_port_space = RDMA_PS_TCP;
    if (server) hints.ai_flags = RAI_PASSIVE;
    if (rdma_getaddrinfo(argv[2], argv[3], &hints, &res)) die("rdma_getaddrinfo");
    signal_every = knob("VPP_SIGNAL", 16);
    long sq = knob("VPP_SQ", 2 * signal_every), buf = knob("VPP_BUF", 65536 > 16 * size ? 65536 : 16 * size);
    int shared = knob("VPP_SHARED_CQ", 0) != 0;
    long work_ns = knob("VPP_WORK_NS", 0);
    if (work_ns > 0) {
        /* the counter's rate over 20 ms of the monotonic clock */
        double m0 = mono();
        uint64_t c0 = __rdtsc();
        while (mono() < m0 + 0.02)
            ;
        work_ticks = (uint64_t)((__rdtsc() - c0) / (mono() - m0) * work_ns / 1e9);
    }
    slots = buf / size > SLOTS_MAX ? SLOTS_MAX : buf / size;
    if (slots % 251 == 0) slots--;
    if (signal_every < 1 || sq < signal_every + 1 || slots < 2) {
        fprintf(stderr, "verbs_pingpong: need VPP_SIGNAL >= 1, VPP_SQ > VPP_SIGNAL, VPP_BUF >= 2 x SIZE\n");
        return 1;
    }
    if (server) {
        struct rdma_cm_id *listener;
        if (rdma_create_ep(&listener, res, NULL, NULL)) die("rdma_create_ep");
        if (rdma_listen(listener, 1)) die("rdma_listen");
        if (rdma_get_request(listener, &id)) die("rdma_get_request");
    } else if (rdma_create_ep(&id, res, NULL, NULL)) {
        die("rdma_create_ep");
    }
    int cqe = (int)sq + RECVS + 8;
    int sleep = knob("VPP_SLEEP", 0) != 0;
    if (shared || sleep) {
        channel = ibv_create_comp_channel(id->verbs);
        if (!channel) die("ibv_create_comp_channel");
    }
    if (shared) {
        send_cq = recv_cq = ibv_create_cq(id->verbs, cqe, NULL, channel, 0);
    } else {
        send_cq = ibv_create_cq(id->verbs, cqe, NULL, NULL, 0);
        recv_cq = ibv_create_cq(id->verbs, cqe, NULL, channel, 0);
    }
    if (!send_cq || !recv_cq) die("ibv_create_cq");
    if (mode == SRQ) {
        struct ibv_srq_init_attr sa = {0};
        sa.attr.max_wr = RECVS + 1;
        sa.attr.max_sge = 1;
        if (!(srq = ibv_create_srq(id->pd, &sa))) die("ibv_create_srq");
    }
    struct ibv_qp_init_attr attr = {0};
    attr.srq = srq;
    attr.send_cq = send_cq;
    attr.recv_cq = recv_cq;
    attr.cap.max_send_wr = sq;
    attr.cap.max_recv_wr = RECVS;
    attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
    attr.cap.max_inline_data = INLINE_MAX;
    attr.qp_type = IBV_QPT_RC;
    if (rdma_create_qp(id, NULL, &attr)) die("rdma_create_qp");

    long pages = (buf + 4095) / 4096 * 4096, bufs_len = (RECVS + 1) * size;
    src = aligned_alloc(4096, pages);
    dst = aligned_alloc(4096, pages);
    bufs = aligned_alloc(4096, (bufs_len + 4095) / 4096 * 4096);
    app = malloc(size);
    if (!src || !dst || !bufs || !app) die("aligned_alloc");
    memset(src, 0, buf);
    memset(dst, 0, buf);
    memset(bufs, 0, bufs_len);
    src_mr = ibv_reg_mr(id->pd, src, buf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
    dst_mr = ibv_reg_mr(id->pd, dst, buf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    bufs_mr = ibv_reg_mr(id->pd, bufs, bufs_len, IBV_ACCESS_LOCAL_WRITE);
    if (!src_mr || !dst_mr || !bufs_mr) die("ibv_reg_mr");
    mbox_in_mr = ibv_reg_mr(id->pd, (void *)&mbox_in, sizeof mbox_in,
                            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
    mbox_out_mr = ibv_reg_mr(id->pd, &mbox_out, sizeof mbox_out, IBV_ACCESS_LOCAL_WRITE);
    if (!mbox_in_mr || !mbox_out_mr) die("ibv_reg_mr (mailbox)");
    struct area mine = {(uintptr_t)dst, (uintptr_t)src, (uintptr_t)&mbox_in, dst_mr->rkey, src_mr->rkey, mbox_in_mr->rkey};
    struct ibv_mr *mine_mr = ibv_reg_mr(id->pd, &mine, sizeof mine, IBV_ACCESS_LOCAL_WRITE);
    struct ibv_mr *peer_mr = ibv_reg_mr(id->pd, &peer, sizeof peer, IBV_ACCESS_LOCAL_WRITE);
    if (!mine_mr || !peer_mr) die("ibv_reg_mr");

    /* exchange the buffers' addresses with a SEND each way (received into the QP's own queue,
     * or the SRQ, wr_id RECVS: not a data buffer), then post the data receives */
    {
        struct ibv_sge sge = {(uintptr_t)&peer, sizeof peer, peer_mr->lkey};
        struct ibv_recv_wr wr = {.wr_id = RECVS, .sg_list = &sge, .num_sge = 1}, *bad;
        if (srq ? ibv_post_srq_recv(srq, &wr, &bad) : ibv_post_recv(id->qp, &wr, &bad)) die("ibv_post_recv");
    }
    if (server ? rdma_accept(id, NULL) : rdma_connect(id, NULL)) die(server ? "rdma_accept" : "rdma_connect");
    for (int i = 0; i < RECVS - 1; i++) post_recv(i);
    if (rdma_post_send(id, NULL, &mine, sizeof mine, mine_mr, IBV_SEND_SIGNALED)) die("rdma_post_send");
    await_send();
    await_recv(); /* (the address's receive: a plain RECV, not posted again by take) */
    post_recv(RECVS - 1);
    /* (each side posted its data receives before its SEND: the client sends data only after
     * the server's SEND arrived, the server only after the client's) */

    if (knob("VPP_STREAM", 0)) {
        same_slot = knob("VPP_SAME_SLOT", 0);
        long credit_every = knob("VPP_CREDIT", slots / 4 > 0 ? slots / 4 : 1);
        if ((mode != IMM && mode != WRITE) || ((same_slot || sleep) && mode != IMM) || credit_every < 1 ||
            credit_every > slots) {
            fprintf(stderr, "verbs_pingpong: VPP_STREAM takes modes write and imm (VPP_SAME_SLOT and VPP_SLEEP imm only), 1 <= VPP_CREDIT <= slots\n");
            return 1;
        }
        if (server) {
            stream_recv(iters + warm, credit_every, sleep);
        } else {
            long credits = 0;
            double mib_s = stream_send(iters, warm, sq, &credits);
            printf("mib_s=%.2f\ncredits=%ld\n", mib_s, credits);
        }
        rdma_disconnect(id);
        return 0;
    }

    uint64_t *rtt = malloc(iters * sizeof *rtt), k0 = 0;
    double t0 = 0;
    if (!rtt) die("malloc");
    for (long i = 0; i < iters + warm; i++) {
        if (i == warm) t0 = mono(), k0 = __rdtsc();
        uint64_t k = __rdtsc();
        if (server) {
            recv_msg(i);
            work();
            send_msg(i);
        } else {
            send_msg(i);
            recv_msg(i);
            work();
        }
        if (i >= warm) rtt[i - warm] = __rdtsc() - k;
    }
    double hz = (__rdtsc() - k0) / (mono() - t0);
    if (!server) {
        qsort(rtt, iters, sizeof *rtt, cmp);
        printf("one_way_us=%.2f\n", rtt[iters / 2] / hz / 2 * 1e6);
        printf("p99_us=%.2f\n", rtt[iters * 99 / 100] / hz / 2 * 1e6);
    }
    rdma_disconnect(id);
    return 0;
}

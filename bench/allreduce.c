/* allreduce.c: float32 collectives of edl's CPU back end next to Gloo, Open MPI over TCP and
 * the loopback ceiling, for n processes on this host, one line per (collective, n, size).
 *
 *   allreduce [--collective allreduce,allgather,reduce_scatter|all] [--np 2,3,4]
 *             [--sizes 1K..256M | --max-size 64M] [--budget 0.3] [--quick]
 *             [--only edl,gloo,mpi,ceiling] [--gloo-algos ring,...] [--all-algos]
 *             [--mpi-heap-reuse] [--runs 3]
 *
 * Collectives (default allreduce; each gets a table of its own): allreduce (sum, in place),
 * allgather, reduce_scatter (sum), the last two out of place. A size is the full buffer per
 * rank, as nccl-tests count it: allreduce's buffer, allgather's output, reduce_scatter's input;
 * the last two cut it into n parts of whole floats, rounded down (allreduce_timing.h).
 * algbw = size / time; busbw = algbw times the share of the buffer a ring sends per link:
 * 2(n-1)/n for allreduce, (n-1)/n for the others (ring_passes(), which also sizes the
 * ceiling's stream).
 *
 * The orchestrator (this program) runs, for each collective and n, every implementation over
 * all sizes, one after another (edl, Gloo and MPI --runs times, interleaved: each figure is
 * the median launch, with the launches' spread), then prints their lines side by side:
 *   ceiling  n copies of this program (--worker ceiling) in a TCP ring on 127.0.0.1: each streams
 *            to its next neighbour what a ring of the collective moves per link while
 *            receiving as much from its previous one, all links at once; a ring's busbw cannot
 *            exceed it. Every byte goes through cache (no memory traffic: the loopback's own
 *            cost); the best of two loops and three limits on the bytes in flight (none,
 *            512 KiB, 256 KiB over the ring) counts; it runs before and after the others, and
 *            the best figure at any size is every size's ceiling (the most the loopback carried)
 *   edl      n copies of this program (--worker edl) calling edl_allreduce() in place,
 *            edl_allgather() or edl_reduce_scatter(), joined through an etcd this program
 *            starts (only when built with libedlcoll)
 *   gloo     allreduce_gloo (allreduce_gloo.cc), every algorithm Gloo has for the collective;
 *            the best per size is shown
 *   mpi      allreduce_mpi under mpirun, forced onto TCP (ob1 PML, tcp,self BTLs, lo only)
 * Every worker and driver takes --collective; every figure is timed, and its first call's
 * result checked, by allreduce_timing.h. See docs/bench-allreduce.md. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "allreduce_timing.h"
#include "edl/proc.h"
#include "edl/common.h"
#include "edl/etcd_server.h"
#ifdef EDL_HAVE_COLL
#include "edl/collective.h"
#endif

#define MAX_NP 16
#define RING_CHUNK (1u << 20) /* bytes per send()/recv() of the ceiling's ring */
#define STALL_MS 180000 /* a launch that prints nothing for this long is killed */

enum { IMPL_EDL, IMPL_GLOO, IMPL_MPI, IMPL_CEIL, N_IMPL };
static const char *const impl_names[N_IMPL] = {"edl", "gloo", "mpi", "ceiling"};

typedef struct opts {
    int np[MAX_NP];
    int n_np;
    size_t sizes[AR_MAX_SIZES];
    int n_sizes;
    double budget;
    bool use[N_IMPL];
    bool all_algos;
    bool mpi_heap_reuse;
    const char *gloo_algos; /* NULL: every algorithm of each collective */
    int runs;          /* launches of edl, Gloo and MPI per n: the median counts */
    int colls[AR_N_COLL]; /* the collectives, in the order given */
    int n_colls;
} opts;

#define MAX_RUNS 9

/* One figure, as a driver reported it. */
typedef struct figure {
    char algo[32];
    int64_t ns; /* 0: none */
    bool wrong;
} figure;

typedef struct results {
    int coll; /* the collective, AR_ALLREDUCE, ... */
    figure best[N_IMPL][AR_MAX_SIZES]; /* edl, gloo, mpi: the median run's; ceiling: the best */
    figure run[N_IMPL][MAX_RUNS][AR_MAX_SIZES]; /* each run's best (gloo: best algorithm) */
    double spread[N_IMPL][AR_MAX_SIZES]; /* (slowest - fastest run) / median, in %; -1: one run */
    figure from_memory[AR_MAX_SIZES]; /* the ceiling's ring streaming from and to memory */
    figure gloo[8][AR_MAX_SIZES]; /* every Gloo algorithm, for --all-algos */
    char gloo_algo[8][32];
    int n_gloo;
    char failed[N_IMPL][96]; /* why an implementation has no figures ("" if it has) */
    char info[N_IMPL][96];
} results;

/* ---- sizes ----------------------------------------------------------------------------------- */

static int parse_size(const char *s, const char **end, size_t *out)
{
    char *e;
    unsigned long long v = strtoull(s, &e, 10);
    if (e == s)
        return -1;
    unsigned long long mul = 1;
    switch (*e) {
    case 'K': case 'k': mul = 1ull << 10; e++; break;
    case 'M': case 'm': mul = 1ull << 20; e++; break;
    case 'G': case 'g': mul = 1ull << 30; e++; break;
    }
    if (mul > 1 && e[0] == 'i' && e[1] == 'B')
        e += 2;
    else if (*e == 'B')
        e++;
    v *= mul;
    if (v < 4 || v % 4 || v > (1ull << 31)) /* Gloo's classes count elements in an int */
        return -1;
    *out = (size_t)v;
    *end = e;
    return 0;
}

/* "1K,64K,1M" or "1K..256M" (every power of 4 times the first, up to the last). */
static int parse_sizes(const char *s, size_t *out, int max)
{
    int n = 0;
    const char *e;
    size_t a, b;
    if (strstr(s, "..")) {
        if (parse_size(s, &e, &a) || strncmp(e, "..", 2) || parse_size(e + 2, &e, &b) || *e ||
            b < a)
            return -1;
        for (size_t v = a; v <= b && n < max; v *= 4)
            out[n++] = v;
        return n;
    }
    while (*s) {
        if (n == max || parse_size(s, &e, &out[n++]) || (*e && *e != ','))
            return -1;
        s = *e ? e + 1 : e;
    }
    return n;
}

static const char *size_str(size_t v, char *buf, size_t len)
{
    if (v >= (1u << 20) && v % (1u << 20) == 0)
        snprintf(buf, len, "%zuMiB", v >> 20);
    else if (v >= 1024 && v % 1024 == 0)
        snprintf(buf, len, "%zuKiB", v >> 10);
    else
        snprintf(buf, len, "%zuB", v);
    return buf;
}

/* ---- bytes per link: the one place that knows what a ring of each collective moves --------- */

/* A ring sends (n-1)/n of the full buffer over each link per pass: allreduce makes two
 * (reduce-scatter, then allgather), allgather and reduce_scatter one. */
static int ring_passes(int coll)
{
    return coll == AR_ALLREDUCE ? 2 : 1;
}

/* Bytes a ring `coll` of a full buffer of `full` bytes per rank sends on each link. */
static size_t link_bytes(int coll, size_t full, int n)
{
    return full / (size_t)n * (size_t)(ring_passes(coll) * (n - 1));
}

/* GB/s of the full buffer a call moved (size asked: ar_bytes() says what it moved) */
static double algbw(int coll, size_t size, int64_t ns, int n)
{
    return (double)ar_bytes(coll, size, n) / (double)ns; /* bytes/ns = GB/s */
}

/* busbw as nccl-tests define it: algbw times the share of the buffer a ring sends per link,
 * 2(n-1)/n for allreduce, (n-1)/n for allgather and reduce_scatter; so a ring's busbw and the
 * ceiling's GB/s (link bytes over time) compare directly. */
static double busbw(int coll, size_t size, int64_t ns, int n)
{
    return algbw(coll, size, ns, n) * ring_passes(coll) * (n - 1) / n;
}

/* ---- the ceiling worker: a TCP ring --------------------------------------------------------- */

typedef struct ring {
    int n;
    int coll; /* the collective whose link bytes it streams */
    int next, prev; /* sockets: we send to next and receive from prev */
    size_t window; /* 0: as far ahead as the socket buffers take; else at most this many bytes
                    * sent beyond those received */
    char *hot_s, *hot_r; /* HOT_BYTES each, used over and over: they stay in cache */
    char *sbuf, *rbuf;   /* the whole link's bytes, for streaming from and to memory */
    bool memory;
    bool eager;    /* poll only when neither side moved (edl's engine does this) */
} ring;

#define HOT_BYTES (256u << 10)

static int wait_fd(int fd, short ev)
{
    struct pollfd p = {.fd = fd, .events = ev};
    int rc = poll(&p, 1, 60000);
    if (rc <= 0) {
        fprintf(stderr, "allreduce: ceiling worker: no progress on the ring for 60 s\n");
        return -1;
    }
    return 0;
}

/* Send len bytes to next while receiving len from prev, without blocking on either. Either
 * waits in poll() for both before every call (retrying whichever side is ready at once costs
 * many small system calls, and with more processes than cores that CPU is taken from the
 * peers), or (eager) calls both sides again at once while one of them moved and polls only
 * when neither did. At most RING_CHUNK per call: on a loaded 2-core VM 1 MiB did as well as or
 * better than 256 KiB, 64 KiB or everything at once, and a second thread for sending did not
 * help. */
static int ring_exchange(ring *g, const char *s, char *r, size_t len, size_t window, size_t wrap)
{
    size_t sent = 0, got = 0;
    bool moved = false;
    while (sent < len || got < len) {
        size_t room = !window ? len : got + window > sent ? got + window - sent : 0;
        struct pollfd p[2] = {{.fd = g->next, .events = sent < len && room ? POLLOUT : 0},
                              {.fd = g->prev, .events = got < len ? POLLIN : 0}};
        if (g->eager && moved) {
            p[0].revents = p[0].events;
            p[1].revents = p[1].events;
        } else if (poll(p, 2, 60000) <= 0) {
            fprintf(stderr, "allreduce: ceiling worker: no progress on the ring for 60 s\n");
            return -1;
        }
        moved = false;
        errno = 0;
        if (sent < len && room && p[0].revents) {
            size_t want = len - sent < RING_CHUNK ? len - sent : RING_CHUNK;
            want = want < room ? want : room;
            size_t at = wrap ? sent % wrap : sent;
            want = wrap && want > wrap - at ? wrap - at : want;
            ssize_t k = send(g->next, s + at, want, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (k < 0 && errno != EAGAIN && errno != EINTR)
                goto fail;
            sent += k > 0 ? (size_t)k : 0;
            moved |= k > 0;
        }
        if (got < len && p[1].revents) {
            size_t want = len - got < RING_CHUNK ? len - got : RING_CHUNK;
            size_t at = wrap ? got % wrap : got;
            want = wrap && want > wrap - at ? wrap - at : want;
            ssize_t k = recv(g->prev, r + at, want, MSG_DONTWAIT);
            if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR))
                goto fail;
            got += k > 0 ? (size_t)k : 0;
            moved |= k > 0;
        }
    }
    return 0;
fail:
    fprintf(stderr, "allreduce: ceiling worker: ring socket: %s\n",
            errno ? strerror(errno) : "closed by the peer");
    return -1;
}

static int ring_stream(void *p, size_t count)
{
    ring *g = p;
    size_t len = link_bytes(g->coll, count * sizeof(float) * ar_parts(g->coll, g->n), g->n);
    if (g->memory)
        return ring_exchange(g, g->sbuf, g->rbuf, len, g->window, 0);
    return ring_exchange(g, g->hot_s, g->hot_r, len, g->window, HOT_BYTES);
}

/* After n-1 steps each rank has seen every rank's value, so this is also a barrier. */
static int ring_max(void *p, int64_t *v, int n)
{
    ring *g = p;
    int64_t in[AR_MAX_BATCHES + 2];
    for (int step = 0; step < g->n - 1; step++) {
        if (ring_exchange(g, (const char *)v, (char *)in, (size_t)n * sizeof *v, 0, 0))
            return -1;
        for (int i = 0; i < n; i++)
            v[i] = in[i] > v[i] ? in[i] : v[i];
    }
    return 0;
}

static int ring_barrier(void *p)
{
    int64_t x = 0;
    return ring_max(p, &x, 1);
}

static void tune_socket(int fd)
{
    int one = 1, buf = 4 << 20;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
}

/* fd 3: our listening socket; EDL_BENCH_RING_PORTS: every rank's port, in rank order. */
static int ceiling_connect(ring *g, int rank)
{
    const char *ports = getenv("EDL_BENCH_RING_PORTS");
    int port = 0;
    for (int i = 0; ports && i <= (rank + 1) % g->n; i++) {
        port = atoi(ports);
        ports = strchr(ports, ',');
        ports = ports ? ports + 1 : NULL;
    }
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    g->next = socket(AF_INET, SOCK_STREAM, 0);
    if (g->next < 0 || (tune_socket(g->next), connect(g->next, (struct sockaddr *)&a, sizeof a))) {
        fprintf(stderr, "allreduce: ceiling worker %d: connect to 127.0.0.1:%d: %s\n", rank, port,
                strerror(errno));
        return -1;
    }
    if (wait_fd(3, POLLIN) || (g->prev = accept(3, NULL, NULL)) < 0)
        return -1;
    tune_socket(g->prev);
    fcntl(g->next, F_SETFL, O_NONBLOCK);
    fcntl(g->prev, F_SETFL, O_NONBLOCK);
    close(3);
    return 0;
}

static int worker_ceiling(ar_driver *d, const size_t *sizes, int n_sizes, double budget)
{
    ring g = {.n = d->size, .coll = d->coll};
    size_t max = 0;
    for (int i = 0; i < n_sizes; i++) {
        size_t len = link_bytes(d->coll, ar_bytes(d->coll, sizes[i], d->size), d->size);
        max = len > max ? len : max;
    }
    g.hot_s = ar_alloc_touched(HOT_BYTES);
    g.hot_r = ar_alloc_touched(HOT_BYTES);
    g.sbuf = ar_alloc_touched(max);
    g.rbuf = ar_alloc_touched(max);
    if (!g.hot_s || !g.hot_r || !g.sbuf || !g.rbuf) {
        fprintf(stderr, "allreduce: ceiling worker: cannot allocate 2 x %zu bytes\n", max);
        return 1;
    }
    if (ceiling_connect(&g, d->rank))
        return 1;
    d->ctx = &g;
    d->send = d->recv = (float *)g.hot_s; /* not used: it reduces nothing */
    d->verify = 0;
    d->run = ring_stream;
    d->max_i64 = ring_max;
    d->barrier = ring_barrier;
    /* What the loopback itself costs: every byte sent comes from, and every byte received
     * goes to, a 256 KiB buffer used over and over, in cache, so no memory traffic slows the
     * ring (an allreduce reads its data from memory and writes the result back). The best of
     * six ways counts: the two loops of ring_exchange, each with no limit on the bytes in
     * flight (the 4 MiB socket buffers fill) and with 512 KiB or 256 KiB over the whole ring.
     * Between processes on one host what is in flight sits in kernel buffers that both ends
     * touch, and on the 2-core test VM a ring that kept them in cache streamed 2-3 times
     * faster. The same six ways streaming the whole link's bytes from and to memory (as the
     * simplest ring does, "memory,..." figures) are reported beside it, for reference. */
    static const size_t ring_total[] = {0, 512u << 10, 256u << 10};
    for (int i = 0; i < n_sizes; i++)
        for (int memory = 0; memory < 2; memory++)
            for (int eager = 0; eager < 2; eager++)
                for (size_t w = 0; w < sizeof ring_total / sizeof ring_total[0]; w++) {
                    char algo[64];
                    size_t k = 0;
                    g.memory = memory;
                    g.eager = eager;
                    g.window = ring_total[w] / (size_t)d->size;
                    k += (size_t)snprintf(algo, sizeof algo, "%s%s,", memory ? "memory," : "",
                                          eager ? "eager" : "poll");
                    if (g.window)
                        snprintf(algo + k, sizeof algo - k, "%zuK-in-flight", ring_total[w] >> 10);
                    else
                        snprintf(algo + k, sizeof algo - k, "socket-buffers");
                    if (ar_measure(d, "ceiling", algo, sizes[i], budget))
                        return 1;
                }
    free(g.sbuf);
    free(g.rbuf);
    free(g.hot_s);
    free(g.hot_r);
    return 0;
}

/* ---- the edl worker --------------------------------------------------------------------------- */

#ifdef EDL_HAVE_COLL
typedef struct edl_ctx {
    edl_comm *c;
    const ar_driver *d;
} edl_ctx;

static int edl_fail(edl_ctx *e, const char *what, int rc)
{
    fprintf(stderr, "allreduce: edl worker %d: %s: %s (%s)\n", edl_coll_rank(e->c), what,
            edl_strerror(rc), edl_coll_errmsg(e->c));
    return -1;
}

/* allreduce in place; allgather and reduce_scatter from send to recv. */
static int edl_run(void *p, size_t count)
{
    edl_ctx *e = p;
    float *s = e->d->send, *r = e->d->recv;
    int rc;
    switch (e->d->coll) {
    case AR_ALLGATHER:
        rc = edl_allgather(e->c, s, r, count, EDL_FLOAT32);
        break;
    case AR_REDUCE_SCATTER:
        rc = edl_reduce_scatter(e->c, s, r, count, EDL_FLOAT32, EDL_SUM);
        break;
    default:
        rc = edl_allreduce(e->c, r, r, count, EDL_FLOAT32, EDL_SUM);
    }
    return rc ? edl_fail(e, ar_coll_name(e->d->coll), rc) : 0;
}

static int edl_max(void *p, int64_t *v, int n)
{
    edl_ctx *e = p;
    int rc = edl_allreduce(e->c, v, v, (size_t)n, EDL_INT64, EDL_MAX);
    return rc ? edl_fail(e, "edl_allreduce (int64 max)", rc) : 0;
}

static int edl_bar(void *p)
{
    edl_ctx *e = p;
    int rc = edl_barrier(e->c);
    return rc ? edl_fail(e, "edl_barrier", rc) : 0;
}

static int worker_edl(ar_driver *d, const size_t *sizes, int n_sizes, double budget)
{
    edl_ctx e = {.d = d};
    size_t max = 0;
    for (int i = 0; i < n_sizes; i++)
        max = sizes[i] > max ? sizes[i] : max;
    bool no_mem = ar_alloc_bufs(d, max) != 0;
    int rc = edl_coll_open(NULL, &e.c);
    if (rc) {
        fprintf(stderr, "allreduce: edl worker %d: edl_coll_open: %s\n", d->rank,
                edl_strerror(rc));
        return 1;
    }
    if (no_mem || edl_coll_size(e.c) != d->size) {
        fprintf(stderr, "allreduce: edl worker %d: %s\n", d->rank,
                no_mem ? "out of memory" : "the communicator's size is not EDL_WORLD_SIZE");
        return 1;
    }
    d->ctx = &e;
    d->verify = 1;
    d->run = edl_run;
    d->max_i64 = edl_max;
    d->barrier = edl_bar;
    for (int i = 0; i < n_sizes && !rc; i++)
        rc = ar_measure(d, "edl", edl_coll_backend(e.c), sizes[i], budget);
    edl_coll_close(e.c);
    ar_free_bufs(d);
    return rc ? 1 : 0;
}
#endif

/* allreduce --worker ceiling|edl --collective C --sizes BYTES,... --budget S; EDL_RANK,
 * EDL_WORLD_SIZE. */
static int worker_main(int argc, char **argv)
{
    size_t sizes[AR_MAX_SIZES];
    int n_sizes = -1;
    double budget = 0;
    const char *kind = NULL;
    ar_driver d = {0};
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--worker"))
            kind = argv[i + 1];
        else if (!strcmp(argv[i], "--collective"))
            d.coll = ar_coll_parse(argv[i + 1]);
        else if (!strcmp(argv[i], "--sizes"))
            n_sizes = ar_parse_sizes(argv[i + 1], sizes, AR_MAX_SIZES);
        else if (!strcmp(argv[i], "--budget"))
            budget = atof(argv[i + 1]);
    }
    d.rank = getenv("EDL_RANK") ? atoi(getenv("EDL_RANK")) : -1;
    d.size = getenv("EDL_WORLD_SIZE") ? atoi(getenv("EDL_WORLD_SIZE")) : 0;
    if (!kind || n_sizes <= 0 || budget <= 0 || d.rank < 0 || d.size < 2 || d.rank >= d.size ||
        d.coll < 0) {
        fprintf(stderr, "allreduce: a worker is started by the orchestrator only\n");
        return 2;
    }
    if (!strcmp(kind, "ceiling"))
        return worker_ceiling(&d, sizes, n_sizes, budget);
#ifdef EDL_HAVE_COLL
    if (!strcmp(kind, "edl"))
        return worker_edl(&d, sizes, n_sizes, budget);
#endif
    fprintf(stderr, "allreduce: unknown worker %s\n", kind);
    return 2;
}

/* ---- launching and collecting ------------------------------------------------------------- */

typedef struct launch {
    pid_t pid[MAX_NP];
    int n;
    int out; /* read end of rank 0's stdout */
} launch;

/* Start argv; stdout goes to out_fd (rank 0) or /dev/null; listen_fd becomes fd 3; env:
 * "NAME=value" strings added to the child's environment. A bench run inside an edl job does
 * not hand the job's agent pipes to the workers. */
static pid_t spawn(char *const *argv, char *const *env, int out_fd, int listen_fd)
{
    static const char *const unset[] = {"EDL_CONTROL_FD", "EDL_PROGRESS_FD", "EDL_JOB_SECRET_FILE",
                                        NULL};
    char **envp = edl_env_build(NULL, unset, env);
    edl_spawn_opts so = {.argv = argv, .envp = envp, .out = out_fd >= 0 ? out_fd : EDL_SPAWN_NULL,
                         .fds = {{listen_fd, 3}}, .n_fds = listen_fd >= 0 ? 1 : 0};
    char err[512];
    pid_t pid = -1;
    if (!envp || edl_spawn(&so, &pid, err, sizeof err) != 0)
        fprintf(stderr, "allreduce: %s\n", envp ? err : "out of memory");
    edl_env_free(envp);
    return pid;
}

static void kill_launch(launch *l)
{
    for (int i = 0; i < l->n; i++)
        kill(l->pid[i], SIGKILL);
}

/* One line from a driver: a figure (R ...), a note (I ...), or anything else, shown as is. */
static void take_line(const char *line, int impl, const opts *o, results *r)
{
    char kind[8], name[16], algo[32], ok[8];
    unsigned long long bytes;
    long long ns, calls;
    if (sscanf(line, "R %15s %31s %llu %lld %lld %7s", name, algo, &bytes, &ns, &calls, ok) != 6) {
        if (sscanf(line, "I %7s %95[^\n]", kind, r->info[impl]) != 2)
            fprintf(stderr, "%s\n", line); /* not ours: let it be seen */
        return;
    }
    int s = 0;
    while (s < o->n_sizes && o->sizes[s] != bytes)
        s++;
    if (s == o->n_sizes || ns <= 0)
        return;
    figure fig = {.ns = ns, .wrong = strcmp(ok, "ok") != 0};
    snprintf(fig.algo, sizeof fig.algo, "%s", algo);
    figure *best = &r->best[impl][s];
    if (impl == IMPL_CEIL && strncmp(algo, "memory,", 7) == 0)
        best = &r->from_memory[s];
    if (!best->ns || (best->wrong && !fig.wrong) || (!fig.wrong && fig.ns < best->ns))
        *best = fig;
    if (impl != IMPL_GLOO)
        return;
    int a = 0;
    while (a < r->n_gloo && strcmp(r->gloo_algo[a], algo))
        a++;
    if (a == 8)
        return;
    if (a == r->n_gloo)
        snprintf(r->gloo_algo[r->n_gloo++], sizeof r->gloo_algo[0], "%s", algo);
    r->gloo[a][s] = fig;
}

/* Read the drivers' lines until every process has exited; fills r. */
static void collect(launch *l, int impl, const opts *o, results *r)
{
    char buf[8192];
    size_t have = 0;
    bool timed_out = false;
    for (;;) {
        struct pollfd p = {.fd = l->out, .events = POLLIN};
        if (poll(&p, 1, STALL_MS) <= 0) {
            timed_out = true;
            kill_launch(l);
            break;
        }
        ssize_t k = read(l->out, buf + have, sizeof buf - 1 - have);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        have += (size_t)k;
        buf[have] = 0;
        char *start = buf, *nl;
        while ((nl = strchr(start, '\n'))) {
            *nl = 0;
            take_line(start, impl, o, r);
            start = nl + 1;
        }
        have -= (size_t)(start - buf);
        memmove(buf, start, have);
        if (have == sizeof buf - 1)
            have = 0; /* a line this long is not ours */
    }
    close(l->out);
    int worst = 0;
    for (int i = 0; i < l->n; i++) {
        int st;
        waitpid(l->pid[i], &st, 0);
        int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        worst = code > worst ? code : worst;
    }
    if (timed_out)
        snprintf(r->failed[impl], sizeof r->failed[impl], "killed: silent for %d s",
                 STALL_MS / 1000);
    else if (worst)
        snprintf(r->failed[impl], sizeof r->failed[impl], "failed (exit %d, see stderr)", worst);
}

static void sizes_arg(const opts *o, char *buf, size_t len)
{
    size_t k = 0;
    buf[0] = 0;
    for (int i = 0; i < o->n_sizes && k < len; i++)
        k += (size_t)snprintf(buf + k, len - k, "%s%zu", i ? "," : "", o->sizes[i]);
}

/* n copies of this program as workers of `kind`, for collective `coll`. */
static int launch_workers(launch *l, const char *kind, int coll, int n, const opts *o,
                          const char *etcd_ep)
{
    char sizes[512], budget[32];
    /* this very binary, even if a rebuild has replaced the file since it started */
    char self[] = "/proc/self/exe";
    sizes_arg(o, sizes, sizeof sizes);
    snprintf(budget, sizeof budget, "%g", o->budget);
    int lfd[MAX_NP];
    char ports[MAX_NP * 8] = "";
    bool is_ring = !strcmp(kind, "ceiling");
    for (int r = 0; is_ring && r < n; r++) {
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t al = sizeof a;
        lfd[r] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (lfd[r] < 0 || bind(lfd[r], (struct sockaddr *)&a, sizeof a) || listen(lfd[r], 4) ||
            getsockname(lfd[r], (struct sockaddr *)&a, &al))
            return -1;
        /* set before accept so the accepted socket inherits them (window scaling) */
        int buf = 4 << 20;
        setsockopt(lfd[r], SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
        snprintf(ports + strlen(ports), sizeof ports - strlen(ports), "%s%d", r ? "," : "",
                 ntohs(a.sin_port));
    }
    int pipefd[2];
    if (pipe2(pipefd, O_CLOEXEC))
        return -1;
    l->n = n;
    l->out = pipefd[0];
    char secret[80] = "EDL_JOB_SECRET=";
    uint8_t key[32]; /* the group's links are authenticated: a secret for this launch */
    if (getrandom(key, sizeof key, 0) != (ssize_t)sizeof key)
        return -1;
    for (size_t i = 0; i < sizeof key; i++)
        snprintf(secret + strlen(secret), 3, "%02x", key[i]);
    static int launches; /* a job of its own per launch: a second one under the same id would
                          * find the first one's rendezvous entries in etcd */
    launches++;
    for (int r = 0; r < n; r++) {
        char e[10][160];
        snprintf(e[0], sizeof e[0], "EDL_RANK=%d", r);
        snprintf(e[1], sizeof e[1], "EDL_WORLD_SIZE=%d", n);
        snprintf(e[2], sizeof e[2], "EDL_BENCH_RING_PORTS=%s", ports);
        snprintf(e[3], sizeof e[3], "EDL_ETCD_ENDPOINTS=%s", etcd_ep ? etcd_ep : "");
        snprintf(e[4], sizeof e[4], "EDL_ETCD_PREFIX=/edl/v1");
        snprintf(e[5], sizeof e[5], "EDL_JOB_ID=bench-%d-%d-%d", (int)getpid(), n, launches);
        snprintf(e[6], sizeof e[6], "EDL_GENERATION=1");
        snprintf(e[7], sizeof e[7], "PADDLE_CURRENT_ENDPOINT=127.0.0.1:0");
        snprintf(e[8], sizeof e[8], "EDL_COLL_BACKEND=cpu"); /* whatever the caller's says */
        char *env[11] = {e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7], e[8], secret, NULL};
        if (is_ring)
            env[3] = NULL;
        char *argv[] = {self, "--worker", (char *)kind, "--collective",
                        (char *)ar_coll_name(coll), "--sizes", sizes, "--budget", budget, NULL};
        l->pid[r] = spawn(argv, env, r == 0 ? pipefd[1] : -1, is_ring ? lfd[r] : -1);
    }
    close(pipefd[1]);
    for (int r = 0; is_ring && r < n; r++)
        close(lfd[r]);
    return 0;
}

static int launch_gloo(launch *l, int coll, int n, const opts *o, const char *algo,
                       const char *store)
{
    char sizes[512], budget[32], prog[4200];
    sizes_arg(o, sizes, sizeof sizes);
    snprintf(budget, sizeof budget, "%g", o->budget);
    snprintf(prog, sizeof prog, "%s/allreduce_gloo", EDL_BENCH_DIR);
    int pipefd[2];
    if (pipe2(pipefd, O_CLOEXEC))
        return -1;
    l->n = n;
    l->out = pipefd[0];
    for (int r = 0; r < n; r++) {
        char rank[16], size[16];
        snprintf(rank, sizeof rank, "%d", r);
        snprintf(size, sizeof size, "%d", n);
        char *argv[] = {prog, "--rank", rank, "--size", size, "--store", (char *)store,
                        "--sizes", sizes, "--budget", budget, "--algos", (char *)algo,
                        "--collective", (char *)ar_coll_name(coll), NULL};
        l->pid[r] = spawn(argv, NULL, r == 0 ? pipefd[1] : -1, -1);
    }
    close(pipefd[1]);
    return 0;
}

static int launch_mpi(launch *l, int coll, int n, const opts *o)
{
    char sizes[512], budget[32], prog[4200], np[16];
    sizes_arg(o, sizes, sizeof sizes);
    snprintf(budget, sizeof budget, "%g", o->budget);
    snprintf(prog, sizeof prog, "%s/allreduce_mpi", EDL_BENCH_DIR);
    snprintf(np, sizeof np, "%d", n);
    int pipefd[2];
    if (pipe2(pipefd, O_CLOEXEC))
        return -1;
    l->n = 1;
    l->out = pipefd[0];
    /* ob1 with only tcp,self: the UCX PML and the vader BTL would use shared memory. No
     * binding, like the other implementations' processes. */
    char *argv[32] = {"mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
                      "-np", np, "--mca", "pml", "ob1", "--mca", "btl", "tcp,self",
                      "--mca", "btl_tcp_if_include", "lo"};
    int k = 16;
    if (o->mpi_heap_reuse) {
        /* Open MPI allocates its temporary buffer on every call; above 32 MiB glibc maps it
         * fresh and the first touch dominates. From the heap, kept after free, it is reused. */
        argv[k++] = "-x";
        argv[k++] = "MALLOC_MMAP_MAX_=0";
        argv[k++] = "-x";
        argv[k++] = "MALLOC_TRIM_THRESHOLD_=4294967296";
    }
    char *rest[] = {prog, "--sizes", sizes, "--budget", budget, "--collective",
                    (char *)ar_coll_name(coll), NULL};
    memcpy(argv + k, rest, sizeof rest);
    /* mpirun sends every rank's stdout to its own; only rank 0 prints */
    l->pid[0] = spawn(argv, NULL, pipefd[1], -1);
    close(pipefd[1]);
    return 0;
}

static bool in_path(const char *prog)
{
    const char *path = getenv("PATH");
    char buf[4096];
    while (path && *path) {
        size_t len = strcspn(path, ":");
        snprintf(buf, sizeof buf, "%.*s/%s", (int)len, path, prog);
        if (access(buf, X_OK) == 0)
            return true;
        path += len + (path[len] == ':');
    }
    return false;
}

/* Whether the comma-separated `list` names `item`. */
static bool in_list(const char *list, const char *item)
{
    size_t len = strlen(item);
    for (const char *p = list; *p;) {
        size_t k = strcspn(p, ",");
        if (k == len && !strncmp(p, item, len))
            return true;
        p += k + (p[k] == ',');
    }
    return false;
}

static int rm_entry(const char *p, const struct stat *st, int f, struct FTW *w)
{
    (void)st, (void)f, (void)w;
    return remove(p);
}

/* ---- report --------------------------------------------------------------------------------- */

static void fmt_time(int64_t ns, char *buf, size_t len)
{
    if (ns < 1000000)
        snprintf(buf, len, "%7.1f us", ns / 1e3);
    else
        snprintf(buf, len, "%7.1f ms", ns / 1e6);
}

/* "edl      45.1 us  1.45/1.45 GB/s" or the reason there is no figure. */
static void fmt_cell(const results *r, int impl, int s, const opts *o, int n, char *buf,
                     size_t len)
{
    const figure *f = &r->best[impl][s];
    char label[48], t[24];
    if (impl == IMPL_GLOO && f->ns)
        snprintf(label, sizeof label, "gloo(%s)", f->algo);
    else if (impl == IMPL_MPI && o->mpi_heap_reuse)
        snprintf(label, sizeof label, "mpi(heap_reuse)");
    else
        snprintf(label, sizeof label, "%s", impl_names[impl]);
    if (!f->ns) {
        snprintf(buf, len, "%-22s %s", label, r->failed[impl][0] ? r->failed[impl] : "n/a");
        return;
    }
    char spread[24] = "";
    if (impl != IMPL_CEIL && r->spread[impl][s] >= 0)
        snprintf(spread, sizeof spread, " ±%2.0f%%", r->spread[impl][s]);
    fmt_time(f->ns, t, sizeof t);
    snprintf(buf, len, "%-22s %s%s %5.2f/%5.2f GB/s%s", label, t, spread,
             algbw(r->coll, o->sizes[s], f->ns, n), busbw(r->coll, o->sizes[s], f->ns, n),
             f->wrong ? " WRONG RESULT" : "");
}

static bool usable(const figure *f)
{
    return f->ns && !f->wrong;
}

/* An upper bound: the best GB/s the ceiling's ring reached at any size in this run, the most
 * the loopback carried; *at: the size it came from. Taking only this size or smaller ones (as
 * before) let a low 16 MiB launch cap 16 MiB at what 64 KiB reached, and edl passed it. Small
 * calls stay far below it: that is their latency, which no bandwidth bound measures. */
static const figure *ceiling_best(const results *r, const opts *o, int n, double *bw, int *at)
{
    const figure *c = NULL;
    *bw = 0;
    for (int t = 0; t < o->n_sizes; t++) {
        const figure *f = &r->best[IMPL_CEIL][t];
        double v = f->ns ? busbw(r->coll, o->sizes[t], f->ns, n) : 0;
        if (v > *bw) {
            *bw = v;
            c = f;
            *at = t;
        }
    }
    return c;
}

/* " ceiling(eager,...,at 64MiB) 2.88 GB/s | from memory 2.10 GB/s |" */
static size_t fmt_ceiling(const results *r, const opts *o, int n, int s, char *line, size_t len)
{
    double bw;
    int at = s;
    const figure *c = ceiling_best(r, o, n, &bw, &at);
    size_t k = 0;
    if (c) {
        char where[48] = "", fsz[32];
        if (at != s)
            snprintf(where, sizeof where, ",at %s", size_str(o->sizes[at], fsz, sizeof fsz));
        k += (size_t)snprintf(line, len, " ceiling(%s%s) %5.2f GB/s |", c->algo, where, bw);
    }
    const figure *m = &r->from_memory[s];
    if (m->ns)
        k += (size_t)snprintf(line + k, len - k, " from memory %5.2f GB/s |",
                              busbw(r->coll, o->sizes[s], m->ns, n));
    else
        k += (size_t)snprintf(line + k, len - k, " ceiling %s |",
                              r->failed[IMPL_CEIL][0] ? r->failed[IMPL_CEIL] : "n/a");
    return k;
}

/* " edl/gloo 1.88x | of ceiling: edl 80% gloo 43% mpi 60% | edl of from-memory 83%" */
static size_t fmt_ratios(const results *r, const opts *o, int n, int s, char *line, size_t len)
{
    const figure *e = &r->best[IMPL_EDL][s], *g = &r->best[IMPL_GLOO][s];
    size_t k = 0;
    if (usable(e) && usable(g))
        k += (size_t)snprintf(line, len, " edl/gloo %.2fx", (double)g->ns / (double)e->ns);
    else
        k += (size_t)snprintf(line, len, " edl/gloo n/a");
    double ceil_bw = 0;
    int at;
    ceiling_best(r, o, n, &ceil_bw, &at);
    k += (size_t)snprintf(line + k, len - k, " | of ceiling:");
    for (int i = 0; i < IMPL_CEIL; i++) {
        const figure *f = &r->best[i][s];
        if (!o->use[i])
            continue;
        double pct = usable(f) && ceil_bw > 0
                         ? 100.0 * busbw(r->coll, o->sizes[s], f->ns, n) / ceil_bw : 0;
        if (pct > 0)
            k += (size_t)snprintf(line + k, len - k, " %s %.0f%%%s", impl_names[i], pct,
                                  pct > 100 ? " (ABOVE: no bound)" : "");
        else
            k += (size_t)snprintf(line + k, len - k, " %s n/a", impl_names[i]);
    }
    const figure *mem = &r->from_memory[s];
    if (usable(e) && mem->ns)
        k += (size_t)snprintf(line + k, len - k, " | edl of from-memory %.0f%%",
                              100.0 * (double)mem->ns / (double)e->ns);
    return k;
}

/* --all-algos: every Gloo algorithm's figure at size s. */
static void print_gloo_algos(const results *r, const opts *o, int n, int s, const char *sz)
{
    for (int a = 0; o->all_algos && a < r->n_gloo; a++) {
        const figure *f = &r->gloo[a][s];
        if (!f->ns)
            continue;
        char t[24];
        fmt_time(f->ns, t, sizeof t);
        printf("  gloo-algo n=%d %-6s %-16s %s %5.2f/%5.2f GB/s%s\n", n, sz, f->algo, t,
               algbw(r->coll, o->sizes[s], f->ns, n), busbw(r->coll, o->sizes[s], f->ns, n),
               f->wrong ? " WRONG RESULT" : "");
    }
}

/* Sizes that do not cut into n parts of whole floats: what the calls moved instead. */
static void print_rounding(const results *r, const opts *o, int n)
{
    char line[1024], a[32];
    size_t k = (size_t)snprintf(line, sizeof line, "  %s n=%d: parts rounded down to whole "
                                "floats, GB/s count what moved:", ar_coll_name(r->coll), n);
    bool any = false;
    for (int s = 0; s < o->n_sizes && k < sizeof line; s++) {
        size_t moved = ar_bytes(r->coll, o->sizes[s], n);
        if (moved == o->sizes[s])
            continue;
        k += (size_t)snprintf(line + k, sizeof line - k, " %s %zu B;",
                              size_str(o->sizes[s], a, sizeof a), moved);
        any = true;
    }
    if (any)
        puts(line);
}

static void print_n(const results *r, const opts *o, int n)
{
    print_rounding(r, o, n);
    for (int s = 0; s < o->n_sizes; s++) {
        char sz[32], line[1024];
        size_t k = (size_t)snprintf(line, sizeof line, "%s n=%d %-6s ", ar_coll_name(r->coll), n,
                                    size_str(o->sizes[s], sz, sizeof sz));
        for (int i = 0; i < IMPL_CEIL; i++) {
            if (!o->use[i])
                continue;
            char cell[160];
            fmt_cell(r, i, s, o, n, cell, sizeof cell);
            k += (size_t)snprintf(line + k, sizeof line - k, " %s |", cell);
        }
        if (o->use[IMPL_CEIL])
            k += fmt_ceiling(r, o, n, s, line + k, sizeof line - k);
        fmt_ratios(r, o, n, s, line + k, sizeof line - k);
        puts(line);
        print_gloo_algos(r, o, n, s, sz);
        int conns = -1;
        if (s == o->n_sizes - 1 &&
            sscanf(r->info[IMPL_MPI], "tcp_connections_opened %d", &conns) == 1)
            printf("  mpi n=%d: rank 0 opened %d TCP connection(s)%s\n", n, conns,
                   conns ? "" : ": WARNING, its data did not go over TCP");
    }
    fflush(stdout);
}

/* ---- orchestrator ------------------------------------------------------------------------- */

static double memcpy_gbs(void)
{
    size_t len = 64u << 20;
    char *a = ar_alloc_touched(len), *b = ar_alloc_touched(len);
    int64_t t[5];
    for (int i = 0; a && b && i < 5; i++) {
        int64_t s = ar_now_ns();
        memcpy(b, a, len);
        t[i] = ar_now_ns() - s;
        a[i] = b[len - 1 - (size_t)i]; /* keep the copy observable */
    }
    free(a);
    free(b);
    if (!a || !b)
        return 0;
    qsort(t, 5, sizeof t[0], ar_cmp_i64);
    return (double)len / (double)t[2];
}

/* Each Gloo algorithm in processes of its own: in one context, gloo::allreduce's ring ran
 * 100 times slower after the algorithm classes had run (15 s for 16 MiB at n=4). */
static void run_gloo(launch *l, int n, const opts *o, results *r)
{
    int launched = 0;
    for (const char *p = ar_gloo_algos(r->coll); *p; launched++) {
        char algo[32], store[] = "/tmp/edl-bench-gloo-XXXXXX";
        size_t len = strcspn(p, ",");
        snprintf(algo, sizeof algo, "%.*s", (int)len, p);
        p += len + (p[len] == ',');
        if (o->gloo_algos && !in_list(o->gloo_algos, algo)) {
            launched--;
            continue;
        }
        if (!mkdtemp(store)) {
            snprintf(r->failed[IMPL_GLOO], sizeof r->failed[0], "cannot create %s: %s", store,
                     strerror(errno));
            return;
        }
        if (launch_gloo(l, r->coll, n, o, algo, store))
            snprintf(r->failed[IMPL_GLOO], sizeof r->failed[0], "cannot start: %s",
                     strerror(errno));
        else
            collect(l, IMPL_GLOO, o, r);
        nftw(store, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
    }
    if (!launched)
        snprintf(r->failed[IMPL_GLOO], sizeof r->failed[0], "n/a (--gloo-algos: none of %s)",
                 ar_gloo_algos(r->coll));
}

/* Launch one implementation for n processes and collect its figures into r->best. */
static void run_impl(results *r, const opts *o, int impl, int n, const char *etcd_ep,
                     const char *edl_missing)
{
    launch l = {0};
    char *msg = r->failed[impl];
    size_t len = sizeof r->failed[impl];
    int rc = 0;
    char prog[4200];
    switch (impl) {
    case IMPL_CEIL:
        rc = launch_workers(&l, "ceiling", r->coll, n, o, NULL);
        break;
    case IMPL_EDL:
        if (edl_missing) {
            snprintf(msg, len, "%s", edl_missing);
            return;
        }
        rc = launch_workers(&l, "edl", r->coll, n, o, etcd_ep);
        break;
    case IMPL_GLOO:
        snprintf(prog, sizeof prog, "%s/allreduce_gloo", EDL_BENCH_DIR);
        if (access(prog, X_OK))
            snprintf(msg, len, "not built (install libgloo-dev)");
        else
            run_gloo(&l, n, o, r);
        return;
    case IMPL_MPI:
        snprintf(prog, sizeof prog, "%s/allreduce_mpi", EDL_BENCH_DIR);
        if (access(prog, X_OK)) {
            snprintf(msg, len, "not built (install libopenmpi-dev)");
            return;
        }
        if (!in_path("mpirun")) {
            snprintf(msg, len, "mpirun not in PATH (install openmpi-bin)");
            return;
        }
        rc = launch_mpi(&l, r->coll, n, o);
        break;
    }
    if (rc)
        snprintf(msg, len, "cannot start: %s", strerror(errno));
    else
        collect(&l, impl, o, r);
}

static int cmp_figure_ns(const void *a, const void *b)
{
    const figure *x = a, *y = b;
    return (x->ns > y->ns) - (x->ns < y->ns);
}

/* Each size's median run becomes the figure, with the runs' spread beside it. */
static void take_medians(results *r, const opts *o, int impl)
{
    for (int s = 0; s < o->n_sizes; s++) {
        figure f[MAX_RUNS];
        int k = 0;
        for (int run = 0; run < o->runs; run++)
            if (r->run[impl][run][s].ns && !r->run[impl][run][s].wrong)
                f[k++] = r->run[impl][run][s];
        r->spread[impl][s] = -1;
        if (k == 0)
            continue; /* best keeps the last run's (a wrong figure, or none) */
        qsort(f, (size_t)k, sizeof f[0], cmp_figure_ns);
        r->best[impl][s] = f[k / 2];
        if (k > 1)
            r->spread[impl][s] = 100.0 * (double)(f[k - 1].ns - f[0].ns) / (double)f[k / 2].ns;
    }
}

static void run_n(const opts *o, int coll, int n, const char *etcd_ep, const char *edl_missing)
{
    results *r = calloc(1, sizeof *r);
    if (!r) {
        fprintf(stderr, "allreduce: out of memory\n");
        return;
    }
    r->coll = coll;
    /* The ceiling runs first and last and the faster of the two counts per size: on a shared
     * machine one launch can land in a busy moment, and a ceiling must not be that low. In
     * between, --runs rounds of edl, Gloo and MPI, interleaved so that drift hits them alike;
     * each figure is the median round, with the spread of the rounds beside it. */
    static const int rivals[] = {IMPL_EDL, IMPL_GLOO, IMPL_MPI};
    if (o->use[IMPL_CEIL])
        run_impl(r, o, IMPL_CEIL, n, etcd_ep, edl_missing);
    for (int run = 0; run < o->runs; run++)
        for (size_t k = 0; k < sizeof rivals / sizeof rivals[0]; k++) {
            int impl = rivals[k];
            if (!o->use[impl])
                continue;
            memset(r->best[impl], 0, sizeof r->best[impl]);
            run_impl(r, o, impl, n, etcd_ep, edl_missing);
            memcpy(r->run[impl][run], r->best[impl], sizeof r->best[impl]);
        }
    for (size_t k = 0; k < sizeof rivals / sizeof rivals[0]; k++)
        take_medians(r, o, rivals[k]);
    if (o->use[IMPL_CEIL])
        run_impl(r, o, IMPL_CEIL, n, etcd_ep, edl_missing);
    print_n(r, o, n);
    free(r);
}

static void usage(FILE *f)
{
    fprintf(f,
        "usage: allreduce [options]\n"
        "  --collective LIST  some of allreduce,allgather,reduce_scatter, or all (default\n"
        "                     allreduce); each gets its own table\n"
        "  --np LIST          process counts, e.g. 2,3,4 (default; each 2..%d)\n"
        "  --sizes LIST       bytes of the full buffer per rank (allreduce's buffer, allgather's\n"
        "                     output, reduce_scatter's input): 1K,64K,1M or a range 1K..256M\n"
        "                     (powers of 4); suffixes K, M, G (KiB...), multiples of 4 (default\n"
        "                     1K..256M). allgather and reduce_scatter cut it into n parts of\n"
        "                     whole floats, rounded down (at least 4n bytes)\n"
        "  --max-size SIZE    drop the sizes above SIZE\n"
        "  --budget SECONDS   timed calls per size: as many as fit (default 0.3, at least %d)\n"
        "  --quick            sizes 1K,64K,1M,16M and a 0.05 s budget: a smoke run\n"
        "  --only LIST        some of edl,gloo,mpi,ceiling (default: all)\n"
        "  --gloo-algos LIST  run only these of Gloo's algorithms (default: every one of each\n"
        "                     collective): allreduce %s;\n"
        "                     allgather %s; reduce_scatter %s\n"
        "  --all-algos        also print every Gloo algorithm's figure\n"
        "  --mpi-heap-reuse   run Open MPI with glibc's mmap off (MALLOC_MMAP_MAX_=0), so its\n"
        "                     per-call temporary buffer is reused from the heap\n"
        "  --runs K           launches of edl, Gloo and MPI per n, interleaved; each figure is\n"
        "                     the median, ±spread (slowest - fastest, %% of it) beside it\n"
        "                     (default 3; 1 with --quick; at most %d)\n"
        "Prints one line per (collective, n, size); see docs/bench-allreduce.md.\n",
        MAX_NP, AR_MIN_CALLS, ar_gloo_algos(AR_ALLREDUCE), ar_gloo_algos(AR_ALLGATHER),
        ar_gloo_algos(AR_REDUCE_SCATTER), MAX_RUNS);
}

static int bad(const char *what, const char *arg)
{
    fprintf(stderr, "allreduce: bad %s '%s' (try --help)\n", what, arg);
    return 2;
}

static int parse_np(const char *arg, opts *o)
{
    char *e;
    o->n_np = 0;
    for (const char *p = arg; *p; p = *e ? e + 1 : e) {
        long v = strtol(p, &e, 10);
        if (e == p || v < 2 || v > MAX_NP || (*e && *e != ',') || o->n_np == MAX_NP)
            return bad("--np", arg);
        o->np[o->n_np++] = (int)v;
    }
    return 0;
}

static int parse_only(const char *arg, opts *o)
{
    for (int i = 0; i < N_IMPL; i++)
        o->use[i] = in_list(arg, impl_names[i]);
    for (const char *p = arg; *p;) {
        size_t len = strcspn(p, ",");
        int i = 0;
        while (i < N_IMPL && (strlen(impl_names[i]) != len || strncmp(p, impl_names[i], len)))
            i++;
        if (i == N_IMPL)
            return bad("--only (edl,gloo,mpi,ceiling)", arg);
        p += len + (p[len] == ',');
    }
    return 0;
}

/* "all" or a list of collectives, each at most once, run in the order given. */
static int parse_colls(const char *arg, opts *o)
{
    o->n_colls = 0;
    if (!strcmp(arg, "all")) {
        for (int c = 0; c < AR_N_COLL; c++)
            o->colls[o->n_colls++] = c;
        return 0;
    }
    for (const char *p = arg; *p;) {
        char name[32];
        size_t len = strcspn(p, ",");
        snprintf(name, sizeof name, "%.*s", (int)len, p);
        p += len + (p[len] == ',');
        int c = ar_coll_parse(name);
        for (int i = 0; c >= 0 && i < o->n_colls; i++)
            c = o->colls[i] == c ? -1 : c;
        if (c < 0 || o->n_colls == AR_N_COLL)
            return bad("--collective (allreduce,allgather,reduce_scatter or all; each once)",
                       arg);
        o->colls[o->n_colls++] = c;
    }
    return o->n_colls ? 0 : bad("--collective", arg);
}

/* Every name of --gloo-algos is an algorithm of one of the collectives asked for. */
static int check_gloo_algos(const opts *o)
{
    for (const char *p = o->gloo_algos; p && *p;) {
        char name[32];
        size_t len = strcspn(p, ",");
        snprintf(name, sizeof name, "%.*s", (int)len, p);
        p += len + (p[len] == ',');
        bool known = false;
        for (int c = 0; c < o->n_colls; c++)
            known |= in_list(ar_gloo_algos(o->colls[c]), name);
        if (!known) {
            fprintf(stderr, "allreduce: --gloo-algos: no collective asked for has %s\n", name);
            return 2;
        }
    }
    return 0;
}

/* Defaults that depend on other options, --max-size, and sizes every collective can cut. */
static int finish_opts(opts *o, size_t max_size, bool quick, bool sizes_given,
                       bool budget_given, bool runs_given)
{
    if (quick && !sizes_given)
        o->n_sizes = parse_sizes("1K,64K,1M,16M", o->sizes, AR_MAX_SIZES);
    if (quick && !budget_given)
        o->budget = 0.05;
    if (!runs_given)
        o->runs = quick ? 1 : 3;
    int k = 0;
    for (int i = 0; i < o->n_sizes; i++)
        if (!max_size || o->sizes[i] <= max_size)
            o->sizes[k++] = o->sizes[i];
    o->n_sizes = k;
    if (!k) {
        fprintf(stderr, "allreduce: no size left under --max-size\n");
        return 2;
    }
    for (int c = 0; c < o->n_colls; c++)
        for (int i = 0; i < o->n_np; i++)
            for (int s = 0; s < o->n_sizes; s++)
                if (!ar_count(o->colls[c], o->sizes[s], o->np[i])) {
                    fprintf(stderr, "allreduce: %s at n=%d needs sizes of at least %d bytes "
                            "(a float per rank), not %zu\n", ar_coll_name(o->colls[c]),
                            o->np[i], 4 * o->np[i], o->sizes[s]);
                    return 2;
                }
    return check_gloo_algos(o);
}

static int parse_opts(int argc, char **argv, opts *o)
{
    static const struct option lo[] = {
        {"np", 1, 0, 'n'},      {"sizes", 1, 0, 's'},      {"max-size", 1, 0, 'm'},
        {"budget", 1, 0, 'b'},  {"quick", 0, 0, 'q'},      {"only", 1, 0, 'o'},
        {"gloo-algos", 1, 0, 'g'}, {"all-algos", 0, 0, 'a'}, {"mpi-heap-reuse", 0, 0, 'r'},
        {"runs", 1, 0, 'k'},    {"collective", 1, 0, 'c'}, {"help", 0, 0, 'h'},
        {0, 0, 0, 0}};
    *o = (opts){.np = {2, 3, 4}, .n_np = 3, .budget = 0.3, .colls = {AR_ALLREDUCE},
                .n_colls = 1};
    o->n_sizes = parse_sizes("1K..256M", o->sizes, AR_MAX_SIZES);
    for (int i = 0; i < N_IMPL; i++)
        o->use[i] = true;
    size_t max_size = 0;
    bool quick = false, sizes_given = false, budget_given = false, runs_given = false;
    int c, rc = 0;
    while (!rc && (c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        char *e;
        const char *end;
        switch (c) {
        case 'n':
            rc = parse_np(optarg, o);
            break;
        case 's':
            o->n_sizes = parse_sizes(optarg, o->sizes, AR_MAX_SIZES);
            rc = o->n_sizes <= 0 ? bad("--sizes", optarg) : 0;
            sizes_given = true;
            break;
        case 'm':
            if (parse_size(optarg, &end, &max_size) || *end)
                rc = bad("--max-size", optarg);
            break;
        case 'b':
            o->budget = strtod(optarg, &e);
            if (*e || !(o->budget > 0 && o->budget <= 60))
                rc = bad("--budget (seconds, 0 to 60)", optarg);
            budget_given = true;
            break;
        case 'q':
            quick = true;
            break;
        case 'o':
            rc = parse_only(optarg, o);
            break;
        case 'g':
            o->gloo_algos = optarg;
            break;
        case 'a':
            o->all_algos = true;
            break;
        case 'r':
            o->mpi_heap_reuse = true;
            break;
        case 'k':
            o->runs = (int)strtol(optarg, &e, 10);
            if (*e || o->runs < 1 || o->runs > MAX_RUNS)
                rc = bad("--runs (1 to 9)", optarg);
            runs_given = true;
            break;
        case 'c':
            rc = parse_colls(optarg, o);
            break;
        case 'h':
            usage(stdout);
            exit(0);
        default:
            usage(stderr);
            return 2;
        }
    }
    if (rc)
        return rc;
    if (optind < argc)
        return bad("argument", argv[optind]);
    return finish_opts(o, max_size, quick, sizes_given, budget_given, runs_given);
}

static void print_header(const opts *o)
{
    printf("bench/allreduce: float32 collectives, n processes on this host (%ld cores), loopback "
           "TCP.\n"
           "  size: the full buffer per rank (allreduce's buffer, allgather's output, "
           "reduce_scatter's input).\n"
           "  time: median over batches of the slowest rank's mean time per call (a barrier before "
           "each batch;\n"
           "  %.2g s of calls per size, at least %d, after a warm-up); algbw = size/time, busbw = "
           "algbw * the share\n"
           "  of the buffer a ring sends per link (GB/s; per collective below).\n"
           "  edl, gloo, mpi: the median of %d interleaved launches, ± (slowest - fastest) in %% of "
           "it when more than one.\n"
           "  ceiling: every link of a TCP ring streams at once what a ring of the collective "
           "moves per link; GB/s\n"
           "  comparable to busbw; through cache, no memory traffic; the best of two loops and "
           "three limits on the\n"
           "  bytes in flight (named), measured before and after the others for each n; its best "
           "at any size is the\n"
           "  ceiling of every size. from memory: the same ring streaming from one big buffer into "
           "another (reference).\n"
           "  gloo: the fastest correct algorithm; mpi: Open MPI, ob1 PML over TCP BTL only.\n"
           "  memcpy one thread, 64 MiB: %.1f GB/s\n",
           sysconf(_SC_NPROCESSORS_ONLN), o->budget, AR_MIN_CALLS, o->runs, memcpy_gbs());
    fflush(stdout);
}

/* "== allgather: ..." before the collective's lines. */
static void print_title(const opts *o, int coll)
{
    static const char *const what[AR_N_COLL] = {
        "float32 sum, in place",
        "float32, out of place: each rank sends a part of size/n, receives the n parts",
        "float32 sum, out of place (Gloo's in place): each rank sends n parts of size/n, "
        "receives its part's sum"};
    char algos[128] = "", share[8];
    size_t k = 0;
    for (const char *p = ar_gloo_algos(coll); *p && k < sizeof algos;) {
        char name[32];
        size_t len = strcspn(p, ",");
        snprintf(name, sizeof name, "%.*s", (int)len, p);
        p += len + (p[len] == ',');
        if (!o->gloo_algos || in_list(o->gloo_algos, name))
            k += (size_t)snprintf(algos + k, sizeof algos - k, "%s%s", k ? "," : "", name);
    }
    share[0] = 0;
    if (ring_passes(coll) > 1)
        snprintf(share, sizeof share, "%d", ring_passes(coll));
    printf("\n== %s: %s.\n   busbw = algbw*%s(n-1)/n; the ceiling's ring streams %s(n-1)/n x size "
           "per link; gloo: %s.\n",
           ar_coll_name(coll), what[coll], share, share, k ? algos : "none");
    fflush(stdout);
}

int main(int argc, char **argv)
{
    if (argc > 2 && !strcmp(argv[1], "--worker"))
        return worker_main(argc, argv);
    opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc)
        return rc;

    const char *edl_missing = NULL;
    edl_etcd_server *srv = NULL;
#ifdef EDL_HAVE_COLL
    if (o.use[IMPL_EDL]) {
        edl_etcd_server_opts so = {.quiet = true};
        rc = edl_etcd_server_open(&so, &srv);
        if (rc)
            edl_missing = "n/a (no etcd: set EDL_ETCD_BIN or put etcd in PATH)";
    }
#else
    edl_missing = "n/a (built without libedlcoll)";
#endif
    print_header(&o);
    for (int c = 0; c < o.n_colls; c++) {
        print_title(&o, o.colls[c]);
        for (int i = 0; i < o.n_np; i++)
            run_n(&o, o.colls[c], o.np[i], srv ? edl_etcd_server_endpoint(srv, 0) : NULL,
                  edl_missing);
    }
    edl_etcd_server_close(srv);
    return 0;
}

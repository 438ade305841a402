/* ps.c: the parameter server's throughput beside two bounds measured in the same run: the
 * loopback's streams, and an echo of the PS's own bytes (the transport bound).
 *
 *   ps [--pairs 1x1,2x2] [--dim 16] [--batch 10000] [--keys 1M] [--dense 16M] [--seconds 2]
 *      [--quick]
 *
 * For each W x S (workers x servers): S edl-ps processes (build/bin/edl-ps, 127.0.0.1, a job
 * secret in a temporary file) and W worker processes, each an edl_ps_client on every server.
 *   bound        W receiver processes each connected to S sender processes (plain TCP, 4 MiB
 *                socket buffers, 1 MiB writes from a buffer in cache), all streams at once:
 *                the bytes per second the loopback carries in one direction with this
 *                topology, the best of three tries of --seconds each (the echo's calls,
 *                whose buffers stay in cache, can move more).
 *   sparse pull  batches of --batch random keys of a --keys key space (every row created by a
 *                warm-up pull first), rows of --dim floats: keys/s over all workers; its
 *                payload is the rows (4 dim bytes a key)
 *   sparse push  the same keys with gradients (SGD on the server): payload 8 + 4 dim a key
 *   dense pull   the whole dense table of --dense floats (split over 1,024 shards), GB/s
 *   dense push   its gradients (SGD), GB/s
 *   echo         each phase's echo bound, in turns with it (ECHO_SLICES turns of --seconds /
 *                ECHO_SLICES each): S echo processes (a thread a connection: read a request
 *                whole, write its reply) and, in each worker, as many connections as its PS
 *                client has links; each echo call moves, on each link the PS call used, the
 *                bytes the PS call moved there (from the client's byte counters; requests and
 *                replies of the same sizes, dense ranges in as many pieces), all links at once
 *                in one poll loop, one call in flight. What a PS whose work cost nothing would
 *                do with these sockets and this protocol's bytes: the transport bound.
 *   CPU a key    under each sparse line: the servers' CPU (/proc ticks over the phase; they
 *                work only in the PS's turns) and a client's (its thread's CPU clock in them),
 *                in ns a key moved; and the echo servers' CPU a key the echo moved.
 *   table        one thread on the same table in this process (ps/table.c: no network, no
 *                client), the same batches sorted by shard as the client sends them, only the
 *                table's call timed: what one loop of a server can do at most, printed once
 *                under the first pair's sparse lines.
 * Each line: the rate, the payload GB/s and its share of the bound, the echo's rate and the
 * PS's share of it. Then the servers' memory:
 * bytes a row of the sparse table, and of a CTR table over the same keys (the CTR accessor,
 * rows of --dim floats): without embedx, with it, and after a shrink that evicts half.
 *
 * Then the modes (--ctr-examples N, 0: skip): examples/ctr (logistic regression plus embeddings,
 * 13 dense and 26 sparse slots) trained in one process (--local), then on edl-ps in each mode
 * with each W x S, one thread per worker: test AUC and logloss, examples/s per trainer thread
 * against the local figure, bytes sent per example against async's, and the servers' CPU
 * time per example trained (from /proc, the workers' test pass included) beside the local
 * trainer's time per example: when the servers share the trainers' cores, a trainer thread
 * cannot beat local by more than that leaves.
 *
 * Then a server joins (--join, on by default; 0 skips): 2 servers (threads of this process)
 * hold every row of the key space while one client pushes batches; a third joins the map. It
 * prints how many shards and bytes moved, the time until the new server had all of its shards,
 * and the time until the client's push rate over 200 ms was back to 90 % of the rate before
 * the join. Then the cost of replication on the same in-process servers (two of them): the
 * sparse push rate of a table with 2 replicas against one with 1, in the same run. See
 * docs/ps.md. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <stdatomic.h>

#include "edl/log.h"
#include "edl/net.h"
#include "edl/proc.h"
#include "edl/ps.h"
#include "edl/wire.h"
#include "internal.h" /* ps/: the table alone, for its bound */
#include "proc_usage.h"

#define MAX_PROCS 8
#define CHUNK (1u << 20)
#define ECHO_SLICES 4 /* turns of a PS phase and its echo */

typedef struct opts {
    int pairs[8][2], n_pairs;
    uint32_t dim, batch;
    uint64_t keys, dense;
    double seconds;
    long ctr_examples;
    int join, lanes;
} opts;

enum { PH_SPULL, PH_SPUSH, PH_DPULL, PH_DPUSH, N_PHASES };
static const char *const phase_names[N_PHASES] = {"sparse pull", "sparse push", "dense pull",
                                                  "dense push"};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* CPU seconds of the calling thread (a worker's client runs in its caller's thread). */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die(const char *what)
{
    fprintf(stderr, "ps: %s\n", what);
    exit(1);
}

/* ---- the loopback bound ---------------------------------------------------------------------- */

static void tune(int fd)
{
    int one = 1, buf = 4 << 20;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
}

static int listen_any(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof a;
    tune(fd);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 64) ||
        getsockname(fd, (struct sockaddr *)&a, &l))
        die("cannot listen on 127.0.0.1");
    *port = ntohs(a.sin_port);
    return fd;
}

/* A sender: accept w connections, then write to all of them until they close. */
static void bound_sender(int lfd, int w)
{
    static char buf[CHUNK];
    struct pollfd pf[MAX_PROCS];
    for (int i = 0; i < w; i++) {
        pf[i] = (struct pollfd){.fd = accept(lfd, NULL, NULL), .events = POLLOUT};
        tune(pf[i].fd);
    }
    for (int open = w; open > 0;) {
        poll(pf, (nfds_t)w, 1000);
        for (int i = 0; i < w; i++)
            if (pf[i].fd >= 0 && pf[i].revents &&
                send(pf[i].fd, buf, sizeof buf, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 &&
                errno != EAGAIN) {
                close(pf[i].fd);
                pf[i].fd = -1;
                open--;
            }
    }
    _exit(0);
}

/* A receiver: read from s senders for `seconds`; the bytes go to fd out. */
static void bound_receiver(const int *ports, int s, double seconds, int out)
{
    static char buf[CHUNK];
    struct pollfd pf[MAX_PROCS];
    for (int i = 0; i < s; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)ports[i]),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        tune(fd);
        if (connect(fd, (struct sockaddr *)&a, sizeof a))
            die("bound: connect");
        pf[i] = (struct pollfd){.fd = fd, .events = POLLIN};
    }
    double t0 = now_s(), bytes = 0;
    while (now_s() - t0 < seconds) {
        poll(pf, (nfds_t)s, 100);
        for (int i = 0; i < s; i++) {
            ssize_t n = pf[i].revents ? recv(pf[i].fd, buf, sizeof buf, MSG_DONTWAIT) : 0;
            bytes += n > 0 ? (double)n : 0;
        }
    }
    double rate = bytes / (now_s() - t0);
    if (write(out, &rate, sizeof rate) != sizeof rate)
        _exit(1);
    _exit(0);
}

static double measure_bound(int w, int s, double seconds)
{
    int ports[MAX_PROCS], lfd[MAX_PROCS], res[2];
    pid_t kids[2 * MAX_PROCS];
    int nk = 0;
    if (pipe(res))
        die("pipe");
    for (int i = 0; i < s; i++)
        lfd[i] = listen_any(&ports[i]);
    for (int i = 0; i < s; i++)
        if ((kids[nk++] = fork()) == 0)
            bound_sender(lfd[i], w);
    for (int i = 0; i < w; i++)
        if ((kids[nk++] = fork()) == 0)
            bound_receiver(ports, s, seconds, res[1]);
    double total = 0, r;
    for (int i = 0; i < w; i++)
        if (read(res[0], &r, sizeof r) == sizeof r)
            total += r;
    for (int i = 0; i < nk; i++)
        waitpid(kids[i], NULL, 0);
    for (int i = 0; i < s; i++)
        close(lfd[i]);
    close(res[0]);
    close(res[1]);
    return total;
}

/* ---- the echo bound ---------------------------------------------------------------------------- */

/* What a PS call moved on each of its links, from the client's byte counters: the echo moves
 * the same bytes the same way. */
typedef struct echo_plan {
    int links, rounds;  /* connections a call uses; requests on each, one after the other */
    size_t req, resp;   /* bytes of one request and of its reply, on one link */
    double units;       /* keys or floats a call moves: the echo's rate in the PS's unit */
} echo_plan;

static int io_full(int fd, void *buf, size_t len, bool out)
{
    for (size_t done = 0; done < len;) {
        ssize_t n = out ? send(fd, (char *)buf + done, len - done, MSG_NOSIGNAL)
                        : recv(fd, (char *)buf + done, len - done, 0);
        if (n <= 0 && !(n < 0 && errno == EINTR))
            return -1;
        done += n > 0 ? (size_t)n : 0;
    }
    return 0;
}

/* One connection of an echo server: each request starts with the sizes of itself and of its
 * reply (two little-endian 64-bit counts); read it whole, then write the reply. */
static void *echo_conn(void *arg)
{
    int fd = (int)(intptr_t)arg;
    uint8_t h[16];
    char *buf = NULL;
    size_t cap = 0;
    while (io_full(fd, h, sizeof h, false) == 0) {
        uint64_t req = edl_get64(h), resp = edl_get64(h + 8), need = req > resp ? req : resp;
        if (req < sizeof h || need > (1ull << 30))
            break;
        if (need > cap && !(buf = realloc(buf, cap = need)))
            die("out of memory");
        if (io_full(fd, buf, req - sizeof h, false) || io_full(fd, buf, resp, true))
            break;
    }
    close(fd);
    free(buf);
    return NULL;
}

/* An echo server: a thread for each connection, as edl-ps has a loop for each lane. */
static void echo_server(int lfd)
{
    for (int fd; (fd = accept(lfd, NULL, NULL)) >= 0;) {
        pthread_t t;
        edl_net_tune(fd);
        if (pthread_create(&t, NULL, echo_conn, (void *)(intptr_t)fd) == 0)
            pthread_detach(t);
    }
    _exit(0);
}

/* The plan of the calls a worker made: bytes sent and received over calls, as the client cut
 * them (PS_LANE_MIN_*, PS_DENSE_PIECE). */
static echo_plan echo_plan_of(const opts *o, int s, int lanes, bool sparse, double calls,
                              double sent, double received)
{
    echo_plan p = {.links = s, .rounds = 1};
    uint64_t amount = sparse ? o->batch : o->dense;
    if (amount >= (uint64_t)s * (uint64_t)lanes * (sparse ? PS_LANE_MIN_KEYS : PS_LANE_MIN_FLOATS))
        p.links = s * lanes;
    if (!sparse) {
        uint64_t piece = (uint64_t)PS_DENSE_PIECE * (uint64_t)(s * lanes);
        p.rounds = (int)((amount + piece - 1) / piece);
    }
    double per = calls * p.rounds * p.links;
    p.req = (size_t)(sent / per), p.resp = (size_t)(received / per);
    p.req = p.req < 16 ? 16 : p.req;
    p.units = (double)amount;
    return p;
}

/* One echo call: every link sends its request and reads its reply, all in one poll loop (as
 * the PS client does), `rounds` times. The replies land in `in` (a caller's array). */
static void echo_call(const int *fds, const echo_plan *p, const uint8_t *out, uint8_t *in)
{
    struct pollfd pf[8 * EDL_PS_MAX_LANES];
    size_t sent[8 * EDL_PS_MAX_LANES], got[8 * EDL_PS_MAX_LANES];
    for (int r = 0; r < p->rounds; r++) {
        for (int i = 0; i < p->links; i++)
            pf[i] = (struct pollfd){.fd = fds[i], .events = POLLOUT}, sent[i] = got[i] = 0;
        for (int left = p->links; left > 0;) {
            if (poll(pf, (nfds_t)p->links, 60000) <= 0)
                die("echo: no progress in 60 s");
            for (int i = 0; i < p->links; i++) {
                if (pf[i].revents & (POLLERR | POLLHUP | POLLNVAL))
                    die("echo: a connection failed");
                ssize_t n;
                if (sent[i] < p->req && (pf[i].revents & POLLOUT) &&
                    (n = send(fds[i], out + sent[i], p->req - sent[i],
                              MSG_NOSIGNAL | MSG_DONTWAIT)) > 0 &&
                    (sent[i] += (size_t)n) == p->req)
                    pf[i].events = POLLIN;
                else if (sent[i] == p->req && (pf[i].revents & POLLIN) &&
                         (n = recv(fds[i], in + (size_t)i * p->resp + got[i], p->resp - got[i],
                                   MSG_DONTWAIT)) > 0 &&
                         (got[i] += (size_t)n) == p->resp)
                    pf[i].fd = -1, left--;
            }
        }
    }
}

/* Connections to s echo servers, n of them: link i to server i % s, as the PS client's links. */
static void echo_open(const int *ports, int s, int n, int *fds)
{
    for (int i = 0; i < n; i++) {
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)ports[i % s]),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        if ((fds[i] = socket(AF_INET, SOCK_STREAM, 0)) < 0 ||
            connect(fds[i], (struct sockaddr *)&a, sizeof a))
            die("echo: cannot connect to its server on 127.0.0.1");
        edl_net_tune(fds[i]);
    }
}

/* Echo calls of plan p for `seconds`: keys or floats a second, as the PS phase counts them. */
static double run_echo(const int *fds, const echo_plan *p, double seconds)
{
    uint8_t *out = calloc(1, p->req), *in = malloc((size_t)p->links * (p->resp ? p->resp : 1));
    if (!out || !in)
        die("out of memory");
    edl_put64(out, p->req), edl_put64(out + 8, p->resp);
    double t0 = now_s(), n = 0;
    while (now_s() - t0 < seconds) {
        echo_call(fds, p, out, in);
        n += p->units;
    }
    free(out), free(in);
    return n / (now_s() - t0);
}

/* ---- servers ----------------------------------------------------------------------------------- */

/* Start edl-ps; its "serving on" line gives the port. */
static pid_t start_server(const char *secret_file, char *ep, size_t eplen)
{
    int out[2];
    if (pipe(out))
        die("pipe");
    pid_t pid = fork();
    if (pid == 0) {
        dup2(out[1], 1);
        close(out[0]);
        execl(EDL_BIN_DIR "/edl-ps", "edl-ps", "--secret-file", secret_file, "--job", "bench",
              "--log-level", "error", (char *)NULL);
        _exit(127);
    }
    close(out[1]);
    char line[256] = "";
    FILE *f = fdopen(out[0], "r");
    if (!f || !fgets(line, sizeof line, f) || !strstr(line, "serving on "))
        die("edl-ps did not start (is it built? cmake --build build --target edl-ps)");
    snprintf(ep, eplen, "%s", strstr(line, "serving on ") + 11);
    ep[strcspn(ep, "\n")] = '\0';
    fclose(f);
    return pid;
}

/* ---- workers ----------------------------------------------------------------------------------- */

typedef struct worker_io {
    int go, res; /* read a byte to start a phase; write its rate */
} worker_io;

static uint64_t key_of(uint64_t i)
{
    return i * 0x9e3779b97f4a7c15ull + 1; /* ids spread over the 64-bit space */
}

static double run_sparse(edl_ps_client *c, const opts *o, bool push, double seconds,
                         unsigned *seed, double *calls)
{
    uint64_t *keys = malloc(o->batch * sizeof *keys);
    float *rows = calloc((size_t)o->batch * o->dim, sizeof *rows);
    double t0 = now_s(), n = 0;
    for (size_t i = 0; i < (size_t)o->batch * o->dim; i++)
        rows[i] = 1e-4f;
    while (now_s() - t0 < seconds) {
        uint64_t base = (uint64_t)rand_r(seed) << 16 ^ (uint64_t)rand_r(seed);
        for (uint32_t j = 0; j < o->batch; j++)
            keys[j] = key_of((base + (uint64_t)j * 7919) % o->keys);
        int rc = push ? edl_ps_push_sparse(c, 0, keys, o->batch, rows)
                      : edl_ps_pull_sparse(c, 0, keys, o->batch, rows);
        if (rc)
            die(edl_ps_client_errmsg(c));
        n += o->batch;
    }
    *calls = n / o->batch;
    double rate = n / (now_s() - t0);
    free(keys);
    free(rows);
    return rate;
}

static double run_dense(edl_ps_client *c, const opts *o, bool push, double seconds,
                        double *calls)
{
    float *v = calloc(o->dense, sizeof *v);
    double t0 = now_s(), n = 0;
    while (now_s() - t0 < seconds) {
        int rc = push ? edl_ps_push_dense(c, 1, 0, o->dense, v)
                      : edl_ps_pull_dense(c, 1, 0, o->dense, v);
        if (rc)
            die(edl_ps_client_errmsg(c));
        n += (double)o->dense;
    }
    *calls = n / (double)o->dense;
    free(v);
    return n / (now_s() - t0);
}

static edl_ps_client *worker_client(const char *const *eps, int s, const char *secret_file,
                                    const opts *o)
{
    edl_job_secret sec;
    char why[512];
    edl_job_secret_init(&sec);
    if (edl_job_secret_load_file(&sec, secret_file, why, sizeof why))
        die(why);
    edl_ps_client_options co = {.endpoints = eps, .n_servers = s, .job = "bench",
                                .secret = &sec, .timeout_ms = 60000, .lanes = o->lanes};
    edl_ps_client *c;
    if (edl_ps_client_open(&co, &c, why, sizeof why))
        die(why);
    edl_job_secret_clear(&sec);
    edl_ps_table_config sp, dn;
    edl_ps_table_config_init(&sp);
    sp.dim = o->dim;
    dn = sp;
    dn.kind = EDL_PS_DENSE, dn.dim = 1, dn.size = o->dense;
    if (edl_ps_create_table(c, 0, &sp) || edl_ps_create_table(c, 1, &dn))
        die(edl_ps_client_errmsg(c));
    return c;
}

static void worker(int idx, const char *const *eps, const int *echo_ports, int s,
                   const char *secret_file, const opts *o, worker_io io)
{
    edl_ps_client *c = worker_client(eps, s, secret_file, o);
    unsigned seed = 12345u + (unsigned)idx;
    if (idx == 0) { /* warm-up: every row of the key space exists before the timing */
        uint64_t *keys = malloc(o->batch * sizeof *keys);
        float *rows = malloc((size_t)o->batch * o->dim * sizeof *rows);
        for (uint64_t k = 0; k < o->keys; k += o->batch) {
            uint32_t n = (uint32_t)(o->keys - k < o->batch ? o->keys - k : o->batch);
            for (uint32_t j = 0; j < n; j++)
                keys[j] = key_of(k + j);
            if (edl_ps_pull_sparse(c, 0, keys, n, rows))
                die(edl_ps_client_errmsg(c));
        }
        free(keys);
        free(rows);
    }
    int fds[8 * EDL_PS_MAX_LANES];
    echo_open(echo_ports, s, s * ps_client_lanes(c), fds);
    for (int ph = 0; ph < N_PHASES; ph++) {
        char b;
        double r[3] = {0}, calls = 0, n, cpu = 0;
        uint64_t s0, r0, s1, r1;
        if (write(io.res, r, sizeof r) != sizeof r || read(io.go, &b, 1) != 1)
            _exit(1);
        edl_ps_client_traffic(c, &s0, &r0);
        for (int k = 0; k < ECHO_SLICES; k++) { /* the PS and its echo in turns: the same load */
            double slice = o->seconds / ECHO_SLICES, c0 = cpu_s();
            r[0] += (ph <= PH_SPUSH ? run_sparse(c, o, ph == PH_SPUSH, slice, &seed, &n)
                                    : run_dense(c, o, ph == PH_DPUSH, slice, &n)) / ECHO_SLICES;
            cpu += cpu_s() - c0;
            calls += n;
            edl_ps_client_traffic(c, &s1, &r1);
            echo_plan p = echo_plan_of(o, s, ps_client_lanes(c), ph <= PH_SPUSH, calls,
                                       (double)(s1 - s0), (double)(r1 - r0));
            r[1] += run_echo(fds, &p, slice) / ECHO_SLICES;
            r[2] = 1e9 * cpu / (calls * p.units); /* ns a key (a float) */
        }
        if (write(io.res, r, sizeof r) != sizeof r)
            _exit(1);
    }
    for (int i = 0; i < s * ps_client_lanes(c); i++)
        close(fds[i]);
    edl_ps_client_close(c);
    _exit(0);
}

/* What the servers hold once every row of the key space exists: bytes a row, rows a GiB. */
static void report_memory(const char *const *eps, int s, const char *secret_file,
                          const opts *o)
{
    edl_ps_client *c = worker_client(eps, s, secret_file, o);
    edl_ps_server_stats st;
    if (edl_ps_stats(c, &st))
        die(edl_ps_client_errmsg(c));
    double dense = 4.0 * (double)o->dense, per = ((double)st.bytes - dense) / (double)st.rows;
    printf("  memory: %llu rows of %u floats (SGD) in %.1f MiB besides the dense table: %.0f "
           "bytes a row, %.1f M rows a GiB\n", (unsigned long long)st.rows, o->dim,
           ((double)st.bytes - dense) / (1 << 20), per, (1 << 30) / per / 1e6);
    edl_ps_client_close(c);
}

/* The first n keys of the key space on the CTR table (2): pulled (show 0), or pushed with that
 * show and zero gradients. */
static void ctr_touch(edl_ps_client *c, const opts *o, uint64_t n, float show)
{
    uint64_t *keys = malloc(o->batch * sizeof *keys);
    float *v = calloc((size_t)o->batch * (o->dim + 2), sizeof *v);
    for (uint32_t j = 0; j < o->batch; j++)
        v[(size_t)j * (o->dim + 2)] = show;
    for (uint64_t k = 0; k < n; k += o->batch) {
        uint32_t m = (uint32_t)(n - k < o->batch ? n - k : o->batch);
        for (uint32_t j = 0; j < m; j++)
            keys[j] = key_of(k + j);
        if (show ? edl_ps_push_sparse(c, 2, keys, m, v) : edl_ps_pull_sparse(c, 2, keys, m, v))
            die(edl_ps_client_errmsg(c));
    }
    free(keys);
    free(v);
}

/* The CTR table's rows and bytes: what the servers hold beyond the other tables (base). */
static void ctr_line(edl_ps_client *c, const opts *o, uint64_t base, const char *what)
{
    edl_ps_server_stats st;
    if (edl_ps_stats(c, &st))
        die(edl_ps_client_errmsg(c));
    double rows = (double)(st.rows - o->keys), bytes = (double)(st.bytes - base);
    printf("  CTR memory, %-32s %8.0f rows of %u floats (SGD) in %6.1f MiB: %4.0f bytes a "
           "row, %5.1f M rows a GiB\n", what, rows, o->dim, bytes / (1 << 20), bytes / rows,
           (1 << 30) / (bytes / rows) / 1e6);
}

/* A CTR table of the key space (score = show, embedx from 2, decay 0.5, delete below 1.5):
 * its memory with rows that have no embedx, with embedx on every row, and after a shrink that
 * evicts the half of the rows shown least. */
static void report_ctr_memory(const char *const *eps, int s, const char *secret_file,
                              const opts *o)
{
    edl_ps_client *c = worker_client(eps, s, secret_file, o);
    edl_ps_server_stats st;
    edl_ps_table_config cfg;
    edl_ps_table_config_init(&cfg);
    cfg.dim = o->dim, cfg.accessor = EDL_PS_ACCESSOR_CTR;
    cfg.ctr = (edl_ps_ctr_config){.nonclk_coeff = 1, .click_coeff = 1, .embedx_threshold = 2,
                                  .show_click_decay_rate = 0.5f, .delete_threshold = 1.5f,
                                  .delete_after_unseen_days = 30};
    uint64_t evicted;
    char what[64];
    if (edl_ps_stats(c, &st) || edl_ps_create_table(c, 2, &cfg))
        die(edl_ps_client_errmsg(c));
    ctr_touch(c, o, o->keys, 0);
    ctr_line(c, o, st.bytes, "without embedx:");
    ctr_touch(c, o, o->keys, 2);
    ctr_line(c, o, st.bytes, "with embedx:");
    ctr_touch(c, o, o->keys / 2, 2); /* shows 4 (kept: 2 after the decay) and 2 (1: evicted) */
    if (edl_ps_shrink(c, 2, &evicted))
        die(edl_ps_client_errmsg(c));
    snprintf(what, sizeof what, "after a shrink (%llu evicted):", (unsigned long long)evicted);
    ctr_line(c, o, st.bytes, what);
    edl_ps_client_close(c);
}

/* ---- one W x S --------------------------------------------------------------------------------- */

static void print_line(int w, int s, int ph, const double rate[2], const opts *o, double bound)
{
    double payload = ph == PH_SPULL   ? rate[0] * 4.0 * o->dim
                     : ph == PH_SPUSH ? rate[0] * (8.0 + 4.0 * o->dim)
                                      : rate[0] * 4.0;
    char r[2][64];
    for (int i = 0; i < 2; i++)
        if (ph <= PH_SPUSH)
            snprintf(r[i], sizeof r[i], "%.2f M keys/s", rate[i] / 1e6);
        else
            snprintf(r[i], sizeof r[i], "%.2f GB/s", rate[i] * 4 / 1e9);
    printf("%d x %-13d %-12s %-16s %8.2f %12.2f %8.0f %%   %-16s %6.0f %%\n", w, s,
           phase_names[ph], r[0], payload / 1e9, bound / 1e9, 100 * payload / bound, r[1],
           100 * rate[0] / rate[1]);
}

static int by_shard(const void *a, const void *b)
{
    uint32_t x = edl_ps_key_shard(*(const uint64_t *)a, EDL_PS_DEFAULT_SHARDS);
    uint32_t y = edl_ps_key_shard(*(const uint64_t *)b, EDL_PS_DEFAULT_SHARDS);
    return (x > y) - (x < y);
}

/* The table-alone figures: pulls, pushes without ids (a trainer's local table), pushes with
 * the ids a job's clients send (ACTIVE_CLIENTS trainers in turn), and those again after
 * GONE_CLIENTS other trainers pushed once each (restarted trainers: each is a new client
 * that every shard remembers). */
enum { TP_PULL, TP_PUSH, TP_PUSH_IDS, TP_PUSH_AFTER_GONE, TABLE_PHASES };
#define ACTIVE_CLIENTS 64
#define GONE_CLIENTS 1024

typedef struct table_run {
    const opts *o;
    ps_table *t;
    uint64_t *keys;
    uint8_t *wire, *grads;
    float *rows;
    uint64_t seq, first_token; /* the active trainers: first_token + 0..ACTIVE_CLIENTS-1 */
} table_run;

/* Batches of run_sparse's keys sorted by shard for o->seconds: keys/s of the table's calls. */
static double table_phase(table_run *r, int ph, unsigned *seed)
{
    const opts *o = r->o;
    double t0 = now_s(), in_calls = 0, n = 0;
    while (now_s() - t0 < o->seconds) {
        uint64_t base = (uint64_t)rand_r(seed) << 16 ^ (uint64_t)rand_r(seed);
        for (uint32_t j = 0; j < o->batch; j++)
            r->keys[j] = key_of((base + (uint64_t)j * 7919) % o->keys);
        qsort(r->keys, o->batch, sizeof *r->keys, by_shard);
        for (uint32_t j = 0; j < o->batch; j++)
            edl_put64(r->wire + 8 * (size_t)j, r->keys[j]);
        r->seq++;
        ps_push_id id = {.token = r->first_token + r->seq % ACTIVE_CLIENTS, .seq = r->seq};
        double a = now_s();
        if (ph == TP_PULL)
            ps_table_pull_sparse(r->t, r->wire, o->batch, r->rows);
        else
            ps_table_push_sparse(r->t, r->wire, o->batch, r->grads, ph == TP_PUSH ? NULL : &id);
        in_calls += now_s() - a;
        n += o->batch;
    }
    return n / in_calls;
}

/* A push of o->batch keys (every shard) from each of n clients, first_token on: each shard
 * now knows them, the last first (their first sight is not in the timed phase). */
static void pushes_from(table_run *r, uint64_t first_token, uint64_t n)
{
    for (uint32_t j = 0; j < r->o->batch; j++)
        r->keys[j] = key_of(j);
    qsort(r->keys, r->o->batch, sizeof *r->keys, by_shard);
    for (uint32_t j = 0; j < r->o->batch; j++)
        edl_put64(r->wire + 8 * (size_t)j, r->keys[j]);
    for (uint64_t c = 0; c < n; c++) {
        ps_push_id id = {.token = first_token + c, .seq = ++r->seq};
        ps_table_push_sparse(r->t, r->wire, r->o->batch, r->grads, &id);
    }
}

/* One thread's sparse calls (SGD) on an in-process table of the bench's keys: rate[phase]. */
static void measure_table(const opts *o, double rate[TABLE_PHASES])
{
    edl_ps_table_config cfg;
    edl_ps_table_config_init(&cfg);
    cfg.dim = o->dim;
    table_run r = {.o = o, .keys = malloc(o->batch * sizeof *r.keys),
                   .wire = malloc(o->batch * 8ull),
                   .grads = calloc((size_t)o->batch * o->dim, 4),
                   .rows = malloc((size_t)o->batch * o->dim * sizeof *r.rows)};
    if (!r.keys || !r.wire || !r.grads || !r.rows || ps_table_new(&cfg, &r.t) != 0)
        die("out of memory");
    for (uint64_t k = 0; k < o->keys; k += o->batch) { /* every row made first */
        uint32_t n = (uint32_t)(o->keys - k < o->batch ? o->keys - k : o->batch);
        for (uint32_t j = 0; j < n; j++)
            edl_put64(r.wire + 8 * (size_t)j, key_of(k + j));
        ps_table_pull_sparse(r.t, r.wire, n, r.rows);
    }
    unsigned seed = 777;
    for (int ph = 0; ph < TABLE_PHASES; ph++) {
        if (ph == TP_PUSH_IDS)
            pushes_from(&r, r.first_token = 1, ACTIVE_CLIENTS);
        if (ph == TP_PUSH_AFTER_GONE) { /* the gone, then the trainers that replaced them */
            pushes_from(&r, 1000000, GONE_CLIENTS);
            pushes_from(&r, r.first_token = 2000000, ACTIVE_CLIENTS);
        }
        rate[ph] = table_phase(&r, ph, &seed);
    }
    ps_table_free(r.t);
    free(r.keys), free(r.wire), free(r.grads), free(r.rows);
}

/* The table's physical bound, in the same process: ns a key for two random cache-line misses
 * (a slot in an array of 2 slots of 16 bytes a key, a row of dim floats in an array of the
 * keys' rows), hinted 64 keys at a time, the row copied out: what a table with a slot and a
 * row a key cannot beat on this machine. */
static double measure_misses(const opts *o)
{
    size_t row = (size_t)o->dim * 4, nslot = 2 * (size_t)o->keys;
    char *rows = aligned_alloc(64, (o->keys * row + 63) / 64 * 64);
    uint64_t *slots = aligned_alloc(64, nslot * 16);
    uint32_t *at = malloc(2 * sizeof *at * o->batch);
    float *out = malloc((size_t)o->batch * row);
    if (!rows || !slots || !at || !out)
        die("out of memory");
    memset(rows, 1, o->keys * row);
    memset(slots, 0, nslot * 16);
    unsigned seed = 99;
    uint64_t sum = 0;
    double in_calls = 0, n = 0, t0 = now_s();
    while (now_s() - t0 < o->seconds) {
        for (uint32_t j = 0; j < 2 * o->batch; j++)
            at[j] = (uint32_t)(((uint64_t)rand_r(&seed) << 16 ^ (uint64_t)rand_r(&seed)) %
                               (j & 1 ? nslot : o->keys));
        double a = now_s();
        for (uint32_t j = 0; j < o->batch; j += 64) {
            uint32_t m = o->batch - j < 64 ? o->batch - j : 64;
            for (uint32_t x = 0; x < m; x++) {
                __builtin_prefetch(&slots[2 * (size_t)at[2 * (j + x) + 1]]);
                __builtin_prefetch(rows + row * at[2 * (j + x)]);
            }
            for (uint32_t x = 0; x < m; x++) {
                sum += slots[2 * (size_t)at[2 * (j + x) + 1]];
                memcpy((char *)out + row * (j + x), rows + row * at[2 * (j + x)], row);
            }
        }
        in_calls += now_s() - a;
        n += o->batch;
    }
    free(rows), free(slots), free(at), free(out);
    return sum == 1 ? 0 : 1e9 * in_calls / n; /* sum: the loads are not optimised away */
}

/* The CPU clock ticks of s server processes. */
static long server_ticks(const pid_t *srv, int s)
{
    long all = 0, t, rss;
    for (int i = 0; i < s; i++, all += t)
        proc_usage(srv[i], &t, &rss);
    return all;
}

static void run_pair(int w, int s, const opts *o, const char *secret_file)
{
    fflush(stdout); /* the children must not inherit unwritten output */
    double bound = 0; /* the best of three tries: a shared VM's loopback varies from try to try */
    for (int i = 0; i < 3; i++) {
        double b = measure_bound(w, s, o->seconds);
        bound = b > bound ? b : bound;
    }
    pid_t srv[MAX_PROCS], wk[MAX_PROCS];
    char eps_buf[MAX_PROCS][128];
    const char *eps[MAX_PROCS];
    for (int i = 0; i < s; i++) {
        srv[i] = start_server(secret_file, eps_buf[i], sizeof eps_buf[i]);
        eps[i] = eps_buf[i];
    }
    pid_t echo[MAX_PROCS];
    int echo_ports[MAX_PROCS];
    for (int i = 0; i < s; i++) {
        int lfd = listen_any(&echo_ports[i]);
        if ((echo[i] = fork()) == 0)
            echo_server(lfd);
        close(lfd);
    }
    worker_io io[MAX_PROCS];
    int res[MAX_PROCS];
    for (int i = 0; i < w; i++) {
        int g[2], r[2];
        if (pipe(g) || pipe(r))
            die("pipe");
        if ((wk[i] = fork()) == 0)
            worker(i, eps, echo_ports, s, secret_file, o, (worker_io){.go = g[0], .res = r[1]});
        io[i] = (worker_io){.go = g[1]};
        res[i] = r[0];
    }
    for (int ph = 0; ph < N_PHASES; ph++) {
        double r[3], total[3] = {0};
        long t0 = server_ticks(srv, s), e0 = server_ticks(echo, s);
        for (int i = 0; i < w; i++) /* all ready */
            if (read(res[i], r, sizeof r) != sizeof r)
                die("a worker failed (its message is above)");
        for (int i = 0; i < w; i++)
            if (write(io[i].go, "g", 1) != 1)
                die("a worker is gone");
        for (int i = 0; i < w; i++) {
            if (read(res[i], r, sizeof r) != sizeof r)
                die("a worker failed (its message is above)");
            total[0] += r[0], total[1] += r[1], total[2] += r[2] / w;
        }
        print_line(w, s, ph, total, o, bound);
        double tick = 1e9 / (double)sysconf(_SC_CLK_TCK); /* ns */
        if (ph <= PH_SPUSH) /* each side's servers work in its turns, o->seconds in all */
            printf("  CPU a key: the servers %.0f ns, a client %.0f ns; the echo's servers "
                   "%.0f ns\n", tick * (double)(server_ticks(srv, s) - t0) /
                   (total[0] * o->seconds), total[2], tick * (double)(server_ticks(echo, s) -
                   e0) / (total[1] * o->seconds));
        if (ph == PH_SPUSH && o->pairs[0][0] == w && o->pairs[0][1] == s) {
            double rate[TABLE_PHASES], pull;
            measure_table(o, rate);
            pull = rate[TP_PULL];
            printf("  the table alone, one thread in one process: pull %.2f M keys/s (%.2f GB/s, "
                   "%.0f %% of the bound), push %.2f M keys/s: one server loop's most\n",
                   pull / 1e6, pull * 4 * o->dim / 1e9, 100 * pull * 4 * o->dim / bound,
                   rate[TP_PUSH] / 1e6);
            printf("  its pushes with a job's ids, %d trainers in turn: %.2f M keys/s; from %d "
                   "new ones after %d came and went (restarted trainers are new clients): "
                   "%.2f M keys/s\n", ACTIVE_CLIENTS, rate[TP_PUSH_IDS] / 1e6, ACTIVE_CLIENTS,
                   GONE_CLIENTS, rate[TP_PUSH_AFTER_GONE] / 1e6);
            double miss = measure_misses(o);
            printf("  its physical bound, two random cache-line misses a key (a slot, a row) over "
                   "the same memory: %.0f ns a key; the table's pull %.0f ns, %.0f %% of it\n",
                   miss, 1e9 / pull, 100 * miss * pull / 1e9);
        }
        fflush(stdout);
    }
    for (int i = 0; i < w; i++)
        waitpid(wk[i], NULL, 0);
    report_memory(eps, s, secret_file, o);
    report_ctr_memory(eps, s, secret_file, o);
    for (int i = 0; i < s; i++) {
        kill(srv[i], SIGTERM);
        kill(echo[i], SIGTERM);
        waitpid(srv[i], NULL, 0);
        waitpid(echo[i], NULL, 0);
    }
}

/* ---- the modes, on examples/ctr ------------------------------------------------------------------ */

typedef struct ctr_result {
    double auc, logloss, rate, bytes;
    double server_us; /* the servers' CPU per example trained (the test pass included) */
} ctr_result;

/* Run argv with env added; its stdout's "ctr: ...: test AUC" line into r. */
static int run_ctr(char *const *argv, char *const *env, ctr_result *r, bool wait_it, pid_t *pid)
{
    int out[2];
    if (pipe(out))
        die("pipe");
    if ((*pid = fork()) == 0) {
        dup2(out[1], 1);
        close(out[0]);
        for (int i = 0; env[i]; i++)
            putenv(env[i]);
        execv(argv[0], argv);
        _exit(127);
    }
    close(out[1]);
    char line[1024];
    FILE *f = fdopen(out[0], "r");
    int found = 0;
    while (f && fgets(line, sizeof line, f))
        if (strstr(line, "test AUC") && r) {
            const char *p = strstr(line, "test AUC");
            sscanf(p, "test AUC %lf logloss %lf", &r->auc, &r->logloss);
            p = strstr(line, "); ");
            sscanf(p ? p + 3 : "", "%lf examples/s per trainer thread; %lf", &r->rate, &r->bytes);
            found = 1;
        }
    if (f)
        fclose(f);
    if (wait_it)
        waitpid(*pid, NULL, 0);
    return found;
}

static void run_mode(const opts *o, const char *secret, const char *mode, int w, int s,
                     ctr_result *r)
{
    fflush(stdout);
    char eps[MAX_PROCS][128], list[1024] = "", nw[16], id[MAX_PROCS][32], n[32];
    pid_t srv[MAX_PROCS], wk[MAX_PROCS];
    for (int i = 0; i < s; i++) {
        srv[i] = start_server(secret, eps[i], sizeof eps[i]);
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? "," : "", eps[i]);
    }
    char e_list[1100], e_mode[64], e_secret[128], e_num[48];
    snprintf(e_list, sizeof e_list, "PADDLE_PSERVERS_IP_PORT_LIST=%s", list);
    snprintf(e_mode, sizeof e_mode, "EDL_PS_MODE=%s", mode);
    snprintf(e_secret, sizeof e_secret, "EDL_JOB_SECRET_FILE=%s", secret);
    snprintf(nw, sizeof nw, "%d", w);
    snprintf(e_num, sizeof e_num, "PADDLE_TRAINERS_NUM=%s", nw);
    snprintf(n, sizeof n, "%ld", o->ctr_examples);
    char *argv[] = {EDL_CTR_BIN, "--examples", n, NULL};
    *r = (ctr_result){0};
    for (int i = w - 1; i >= 0; i--) { /* worker 0 last: its output is read to the end */
        snprintf(id[i], sizeof id[i], "PADDLE_TRAINER_ID=%d", i);
        char *env[] = {"TRAINING_ROLE=TRAINER", "EDL_JOB_ID=bench", e_list, e_mode, e_secret,
                       e_num, id[i], NULL};
        if (i > 0 && (wk[i] = fork()) == 0) {
            int null = open("/dev/null", O_WRONLY);
            dup2(null, 1);
            for (int k = 0; env[k]; k++)
                putenv(env[k]);
            execv(argv[0], argv);
            _exit(127);
        }
        if (i == 0 && !run_ctr(argv, env, r, true, &wk[0]))
            fprintf(stderr, "ps: ctr %s %dx%d printed no result\n", mode, w, s);
    }
    for (int i = 1; i < w; i++)
        waitpid(wk[i], NULL, 0);
    long ticks = 0, t, rss;
    for (int i = 0; i < s; i++, ticks += t)
        proc_usage(srv[i], &t, &rss);
    r->server_us = 1e6 * (double)ticks / (double)sysconf(_SC_CLK_TCK) / (double)o->ctr_examples;
    for (int i = 0; i < s; i++) {
        kill(srv[i], SIGTERM);
        waitpid(srv[i], NULL, 0);
    }
}

static void run_modes(const opts *o, const char *secret)
{
    fflush(stdout);
    static const char *const modes[] = {"sync", "async", "half_async", "geo"};
    char n[32];
    snprintf(n, sizeof n, "%ld", o->ctr_examples);
    char *largv[] = {EDL_CTR_BIN, "--local", "--examples", n, NULL}, *noenv[] = {NULL};
    ctr_result local = {0}, r[4];
    pid_t pid;
    if (!run_ctr(largv, noenv, &local, true, &pid))
        die("examples/ctr --local printed no result (is it built?)");
    printf("\nmodes: examples/ctr, %ld examples, batches of 256, one thread a worker\n",
           o->ctr_examples);
    printf("%-10s %-6s %7s %8s %16s %9s %14s %9s %12s\n", "mode", "W x S", "AUC", "logloss",
           "examples/s/thr", "of local", "bytes/example", "of async", "server us/ex");
    printf("%-10s %-6s %7.4f %8.4f %16.0f %9s %14s %9s %12s   (local: %.2f us an example)\n",
           "local", "-", local.auc, local.logloss, local.rate, "1.00", "-", "-", "-",
           1e6 / local.rate);
    for (int p = 0; p < o->n_pairs; p++) {
        for (int m = 0; m < 4; m++)
            run_mode(o, secret, modes[m], o->pairs[p][0], o->pairs[p][1], &r[m]);
        for (int m = 0; m < 4; m++) {
            char ws[16];
            snprintf(ws, sizeof ws, "%dx%d", o->pairs[p][0], o->pairs[p][1]);
            printf("%-10s %-6s %7.4f %8.4f %16.0f %9.2f %14.0f %9.2f %12.2f\n", modes[m], ws,
                   r[m].auc, r[m].logloss, r[m].rate, r[m].rate / local.rate, r[m].bytes,
                   r[m].bytes / r[1].bytes, r[m].server_us);
        }
        fflush(stdout);
    }
}

/* ---- a server joins ------------------------------------------------------------------------------ */

typedef struct join_maps {
    const char *names[3], *eps[3];
    atomic_int gen; /* 1: the first two servers; 2: all three */
} join_maps;

static int join_source(void *arg, int64_t newer_than, edl_ps_servers *out)
{
    join_maps *m = arg;
    int gen = atomic_load(&m->gen);
    if (gen <= newer_than)
        return 0;
    *out = (edl_ps_servers){.generation = gen, .n = gen + 1, .names = m->names,
                            .endpoints = m->eps};
    return 1;
}

static void join_servers(edl_ps_server **srv, char eps[3][64], join_maps *m,
                         const char *secret_file)
{
    static const char *const names[3] = {"ps-a", "ps-b", "ps-c"};
    edl_job_secret sec;
    char why[512];
    edl_job_secret_init(&sec);
    if (edl_job_secret_load_file(&sec, secret_file, why, sizeof why))
        die(why);
    for (int i = 0; i < 3; i++) {
        edl_ps_server_options so = {.threads = 1, .job = "bench", .secret = &sec};
        if (edl_ps_server_open(&so, &srv[i], why, sizeof why) || edl_ps_server_start(srv[i]))
            die(why);
        snprintf(eps[i], 64, "127.0.0.1:%d", edl_ps_server_port(srv[i]));
        m->names[i] = names[i];
        m->eps[i] = eps[i];
    }
    edl_job_secret_clear(&sec);
}

static void publish_join(edl_ps_server **srv, join_maps *m, int gen)
{
    edl_ps_servers map = {.generation = gen, .n = gen + 1, .names = m->names,
                          .endpoints = m->eps};
    for (int i = 0; i <= gen; i++)
        if (edl_ps_server_set_map(srv[i], &map, m->names[i], i == 2))
            die("set_map");
    atomic_store(&m->gen, gen);
}

/* One timed push of a batch; its end time and keys go into the log. */
static void join_push(edl_ps_client *c, const opts *o, unsigned *seed, uint64_t *keys,
                      float *rows, double *t, size_t *n, size_t cap)
{
    uint64_t base = (uint64_t)rand_r(seed) << 16 ^ (uint64_t)rand_r(seed);
    for (uint32_t j = 0; j < o->batch; j++)
        keys[j] = key_of((base + (uint64_t)j * 7919) % o->keys);
    if (edl_ps_push_sparse(c, 0, keys, o->batch, rows))
        die(edl_ps_client_errmsg(c));
    if (*n < cap)
        t[(*n)++] = now_s();
}

/* The first time from t0 on when the batches of the next 200 ms come at `want` a second. */
static double back_at(const double *t, size_t n, double t0, double want)
{
    for (size_t i = 0; i < n; i++) {
        if (t[i] < t0)
            continue;
        size_t j = i;
        while (j < n && t[j] < t[i] + 0.2)
            j++;
        if (j < n && (double)(j - i) / 0.2 >= want)
            return t[i] - t0;
    }
    return -1;
}

static void run_join(const opts *o, const char *secret_file)
{
    edl_ps_server *srv[3];
    char eps[3][64];
    join_maps m = {0};
    edl_log_setup(EDL_LOG_WARN, EDL_LOG_PLAIN, NULL); /* the servers here log to our stderr */
    join_servers(srv, eps, &m, secret_file);
    publish_join(srv, &m, 1);
    edl_ps_client *c;
    edl_job_secret sec;
    char why[512];
    edl_job_secret_init(&sec);
    edl_job_secret_load_file(&sec, secret_file, why, sizeof why);
    edl_ps_client_options co = {.endpoints = m.eps, .names = m.names, .n_servers = 2,
                                .job = "bench", .secret = &sec, .timeout_ms = 60000,
                                .servers = join_source, .servers_arg = &m, .generation = 1};
    if (edl_ps_client_open(&co, &c, why, sizeof why))
        die(why);
    edl_ps_table_config sp;
    edl_ps_table_config_init(&sp);
    sp.dim = o->dim;
    uint64_t *keys = malloc(o->batch * sizeof *keys);
    float *rows = calloc((size_t)o->batch * o->dim, sizeof *rows);
    size_t cap = 1 << 20, n = 0;
    double *t = malloc(cap * sizeof *t);
    if (edl_ps_create_table(c, 0, &sp))
        die(edl_ps_client_errmsg(c));
    for (uint64_t k = 0; k < o->keys; k += o->batch) { /* every row exists */
        uint32_t b = (uint32_t)(o->keys - k < o->batch ? o->keys - k : o->batch);
        for (uint32_t j = 0; j < b; j++)
            keys[j] = key_of(k + j);
        if (edl_ps_pull_sparse(c, 0, keys, b, rows))
            die(edl_ps_client_errmsg(c));
    }
    unsigned seed = 777;
    double start = now_s();
    while (now_s() - start < o->seconds)
        join_push(c, o, &seed, keys, rows, t, &n, cap);
    double before = (double)n / (now_s() - start), t0 = now_s(), moved_at = -1;
    size_t before_n = n;
    uint32_t want = 0;
    for (uint32_t sh = 0; sh < sp.shards; sh++)
        want += edl_ps_shard_owner(m.names, 3, sh) == 2;
    publish_join(srv, &m, 2);
    edl_ps_server_stats st = {0};
    while (now_s() - t0 < 2 * o->seconds + 1 || moved_at < 0) {
        join_push(c, o, &seed, keys, rows, t, &n, cap);
        edl_ps_server_get_stats(srv[2], &st);
        if (moved_at < 0 && st.shards_in >= want)
            moved_at = now_s() - t0;
        if (now_s() - t0 > 60)
            die("the new server did not get its shards within 60 s");
    }
    double back = back_at(t + before_n, n - before_n, t0, 0.9 * before);
    printf("join: 2 -> 3 servers: %u of %u shards moved (%.1f %%, ideal 33.3 %%); the new "
           "server holds %.1f MiB, all of it %.0f ms after the map; pushes back at 90 %% of "
           "the rate before (%.2f M keys/s) after %.0f ms\n", want, sp.shards,
           100.0 * want / sp.shards, (double)st.bytes / (1 << 20), 1e3 * moved_at,
           before * o->batch / 1e6, back < 0 ? -1.0 : 1e3 * back);
    edl_ps_client_close(c);
    edl_job_secret_clear(&sec);
    for (int i = 0; i < 3; i++)
        edl_ps_server_close(srv[i]);
    free(keys), free(rows), free(t);
}

/* Push rate (keys/s) on table `table` of c for o->seconds, every row created first. */
static double push_rate(edl_ps_client *c, const opts *o, uint32_t table, uint64_t *keys,
                        float *rows)
{
    for (uint64_t k = 0; k < o->keys; k += o->batch) {
        uint32_t b = (uint32_t)(o->keys - k < o->batch ? o->keys - k : o->batch);
        for (uint32_t j = 0; j < b; j++)
            keys[j] = key_of(k + j);
        if (edl_ps_pull_sparse(c, table, keys, b, rows))
            die(edl_ps_client_errmsg(c));
    }
    unsigned seed = 99;
    double t0 = now_s(), n = 0;
    while (now_s() - t0 < o->seconds) {
        uint64_t base = (uint64_t)rand_r(&seed) << 16 ^ (uint64_t)rand_r(&seed);
        for (uint32_t j = 0; j < o->batch; j++)
            keys[j] = key_of((base + (uint64_t)j * 7919) % o->keys);
        if (edl_ps_push_sparse(c, table, keys, o->batch, rows))
            die(edl_ps_client_errmsg(c));
        n += o->batch;
    }
    return n / (now_s() - t0);
}

static void run_replicas(const opts *o, const char *secret_file)
{
    edl_ps_server *srv[3];
    char eps[3][64], why[512];
    join_maps m = {0};
    edl_log_setup(EDL_LOG_WARN, EDL_LOG_PLAIN, NULL);
    join_servers(srv, eps, &m, secret_file);
    publish_join(srv, &m, 1); /* the first two */
    edl_job_secret sec;
    edl_job_secret_init(&sec);
    edl_job_secret_load_file(&sec, secret_file, why, sizeof why);
    edl_ps_client_options co = {.endpoints = m.eps, .names = m.names, .n_servers = 2,
                                .job = "bench", .secret = &sec, .timeout_ms = 60000,
                                .servers = join_source, .servers_arg = &m, .generation = 1};
    edl_ps_client *c;
    if (edl_ps_client_open(&co, &c, why, sizeof why))
        die(why);
    edl_ps_table_config one, two;
    edl_ps_table_config_init(&one);
    one.dim = o->dim;
    two = one;
    two.replicas = 2;
    if (edl_ps_create_table(c, 0, &one) || edl_ps_create_table(c, 1, &two))
        die(edl_ps_client_errmsg(c));
    uint64_t *keys = malloc(o->batch * sizeof *keys);
    float *rows = calloc((size_t)o->batch * o->dim, sizeof *rows);
    double r1 = push_rate(c, o, 0, keys, rows), r2 = push_rate(c, o, 1, keys, rows);
    printf("replicas: sparse push on 2 servers, 1 replica %.2f M keys/s, 2 replicas %.2f M "
           "keys/s: %.2f of it (owner and backup in one request per server: twice the rows "
           "applied)\n", r1 / 1e6, r2 / 1e6, r2 / r1);
    edl_ps_client_close(c);
    edl_job_secret_clear(&sec);
    for (int i = 0; i < 3; i++)
        edl_ps_server_close(srv[i]);
    free(keys), free(rows);
}

/* ---- options ----------------------------------------------------------------------------------- */

static uint64_t parse_count(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    double m = *end == 'K' ? 1e3 : *end == 'M' ? 1 << 20 : *end == 'G' ? 1 << 30 : 1;
    if (v <= 0 || (*end && !strchr("KMG", *end)) || (*end && end[1]))
        die("bad count (try --help)");
    return (uint64_t)(v * (*end == 'K' ? 1024 : m));
}

static void usage(FILE *f)
{
    fprintf(f, "Usage: ps [--pairs 1x1,2x2] [--dim 16] [--batch 10000] [--keys 1M]\n"
               "          [--dense 16M] [--seconds 2] [--ctr-examples 200000] [--join 1]\n"
               "          [--lanes N] [--quick]\n"
               "Parameter-server throughput (edl-ps) beside the loopback bound and an echo of\n"
               "its own bytes (the transport bound): see the header of bench/ps.c and\n"
               "docs/ps.md. --quick: 1x1 only, 0.5 s per figure, 100K keys,\n"
               "a 1M-float dense table, 20000 CTR examples. --ctr-examples 0: no modes;\n"
               "--join 0: no server joining and no replication figure. --lanes: the\n"
               "clients' connections to each server (EDL_PS_LANES; default min(CPUs, 4)).\n");
}

static void parse_opts(int argc, char **argv, opts *o)
{
    static const struct option lo[] = {
        {"pairs", 1, 0, 'p'}, {"dim", 1, 0, 'd'},     {"batch", 1, 0, 'b'}, {"keys", 1, 0, 'k'},
        {"dense", 1, 0, 'D'}, {"seconds", 1, 0, 's'}, {"quick", 0, 0, 'q'}, {"help", 0, 0, 'h'},
        {"ctr-examples", 1, 0, 'c'}, {"join", 1, 0, 'j'}, {"lanes", 1, 0, 'l'}, {0, 0, 0, 0}};
    *o = (opts){.pairs = {{1, 1}, {2, 2}}, .n_pairs = 2, .dim = 16, .batch = 10000,
                .keys = 1 << 20, .dense = 16 << 20, .seconds = 2, .ctr_examples = 200000,
                .join = 1};
    for (int c; (c = getopt_long(argc, argv, "h", lo, NULL)) != -1;) {
        switch (c) {
        case 'p':
            o->n_pairs = 0;
            for (char *t = strtok(optarg, ","); t && o->n_pairs < 8; t = strtok(NULL, ",")) {
                int w, s;
                if (sscanf(t, "%dx%d", &w, &s) != 2 || w < 1 || s < 1 || w > MAX_PROCS ||
                    s > MAX_PROCS)
                    die("--pairs: WxS with 1..8 each, e.g. 1x1,2x2");
                o->pairs[o->n_pairs][0] = w, o->pairs[o->n_pairs++][1] = s;
            }
            break;
        case 'd': o->dim = (uint32_t)parse_count(optarg); break;
        case 'b': o->batch = (uint32_t)parse_count(optarg); break;
        case 'k': o->keys = parse_count(optarg); break;
        case 'D': o->dense = parse_count(optarg); break;
        case 's': o->seconds = atof(optarg); break;
        case 'c': o->ctr_examples = atol(optarg); break;
        case 'j': o->join = atoi(optarg) != 0; break;
        case 'l':
            o->lanes = atoi(optarg);
            if (o->lanes < 1 || o->lanes > EDL_PS_MAX_LANES || setenv("EDL_PS_LANES", optarg, 1))
                die("--lanes: 1..8");
            break;
        case 'q':
            *o = (opts){.pairs = {{1, 1}}, .n_pairs = 1, .dim = 16, .batch = 10000,
                        .keys = 100000, .dense = 1 << 20, .seconds = 0.5,
                        .ctr_examples = 20000, .join = 1};
            break;
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); exit(2);
        }
    }
    if (o->dim < 1 || o->dim > EDL_PS_MAX_DIM || o->batch < 1 || o->seconds <= 0 ||
        o->ctr_examples < 0 ||
        o->dense > EDL_PS_MAX_DENSE || o->keys < o->batch)
        die("bad --dim, --batch, --keys, --dense or --seconds (try --help)");
}

int main(int argc, char **argv)
{
    opts o;
    parse_opts(argc, argv, &o);
    char dir[] = "/tmp/edl-bench-ps-XXXXXX", secret[64], why[256];
    if (!mkdtemp(dir))
        die("mkdtemp");
    snprintf(secret, sizeof secret, "%s/secret", dir);
    if (edl_job_secret_generate(secret, why, sizeof why))
        die(why);
    printf("bench/ps: edl-ps on 127.0.0.1, %d CPUs; rows of %u floats, batches of %u keys from "
           "%llu, a dense table of %llu floats; %.1f s a figure\n", edl_cpu_count(), o.dim,
           o.batch, (unsigned long long)o.keys, (unsigned long long)o.dense, o.seconds);
    printf("%-17s %-12s %-16s %8s %12s %10s   %-16s %8s\n", "workers x servers", "what",
           "rate", "GB/s", "bound GB/s", "of bound", "echo", "of echo");
    for (int i = 0; i < o.n_pairs; i++)
        run_pair(o.pairs[i][0], o.pairs[i][1], &o, secret);
    if (o.ctr_examples > 0)
        run_modes(&o, secret);
    if (o.join) {
        run_join(&o, secret);
        run_replicas(&o, secret);
    }
    unlink(secret);
    rmdir(dir);
    return 0;
}
